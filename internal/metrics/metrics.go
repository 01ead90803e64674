// Package metrics is phxmount's Prometheus endpoint (--metrics ADDR). Its
// metrics are derived from the daemon's counters table (client.CounterDescs:
// every counter INFO and user.phx.info carry, the staged transport's read
// policy among them), plus the bytes per transport and direction, latency
// histograms of the data ioctls and of the FUSE requests programs block in
// (fusefs.TimedRequests), and the build. Values are read
// from a Source at each scrape; the package keeps no copy of them.
package metrics

import (
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/phxmount/phxmount/client"
	"github.com/phxmount/phxmount/internal/buildinfo"
	"github.com/phxmount/phxmount/internal/errs"
	"github.com/phxmount/phxmount/phxfs"
)

// Namespace prefixes every metric of the daemon's own.
const Namespace = "phxmount"

// Source gives the metrics their values at each scrape: the control
// server's counters and the library's bytes per transport.
type Source interface {
	Counters() client.Counters
	TransportStats() []phxfs.TransportBytes
}

// Metrics is the registry the endpoint serves and the histogram the
// control observes ioctls into.
type Metrics struct {
	reg      *prometheus.Registry
	ioctl    *prometheus.HistogramVec
	requests *prometheus.HistogramVec
}

// IoctlBuckets are the latency histogram's bounds, in seconds: 50 µs to
// about 13 s, four times apart.
var IoctlBuckets = prometheus.ExponentialBuckets(50e-6, 4, 10)

// RequestBuckets are the FUSE requests' bounds, in seconds: 10 µs to about
// 2.6 s, four times apart.
var RequestBuckets = prometheus.ExponentialBuckets(10e-6, 4, 10)

// New registers the metrics of src, the build's, and the Go runtime's and
// process's standard ones.
func New(src Source, build buildinfo.Info) (*Metrics, error) {
	m := &Metrics{
		reg: prometheus.NewRegistry(),
		ioctl: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: Namespace, Name: "ioctl_duration_seconds",
			Help:    "Time the daemon took to serve data ioctls (READ, WRITE, BATCH_READ, BATCH_WRITE), by command.",
			Buckets: IoctlBuckets,
		}, []string{"command"}),
		requests: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: Namespace, Name: "request_duration_seconds",
			Help:    "Time the daemon took to serve the FUSE requests programs block in (lookup, getattr, open, create, flush, release), by request.",
			Buckets: RequestBuckets,
		}, []string{"request"}),
	}
	info := prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: Namespace, Name: "build_info",
		Help: "The daemon's build: always 1, with the version, commit and Go version as labels."},
		[]string{"version", "commit", "goversion"})
	info.WithLabelValues(build.Version, build.Commit, build.GoVersion).Set(1)
	for _, c := range []prometheus.Collector{
		newCollector(src), m.ioctl, m.requests, info,
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
	} {
		if err := m.reg.Register(c); err != nil {
			return nil, errs.Wrapf(err, "metrics: register")
		}
	}
	return m, nil
}

// Registry is the registry the endpoint serves.
func (m *Metrics) Registry() *prometheus.Registry { return m.reg }

// ObserveIoctl records that an ioctl of command ("read", "batch_read", …)
// took d.
func (m *Metrics) ObserveIoctl(command string, d time.Duration) {
	m.ioctl.WithLabelValues(command).Observe(d.Seconds())
}

// ObserveRequest records that a FUSE request ("open", "flush", …) took d.
func (m *Metrics) ObserveRequest(request string, d time.Duration) {
	m.requests.WithLabelValues(request).Observe(d.Seconds())
}

// collector reads a Source at each scrape.
type collector struct {
	src       Source
	descs     []client.CounterDesc
	counters  []*prometheus.Desc
	transport *prometheus.Desc
}

func newCollector(src Source) *collector {
	c := &collector{src: src, descs: client.CounterDescs()}
	for _, d := range c.descs {
		c.counters = append(c.counters, prometheus.NewDesc(MetricName(d), helpText(d.Doc), nil, nil))
	}
	c.transport = prometheus.NewDesc(Namespace+"_transport_bytes_total",
		"Bytes moved between files and device memory through each transport (kmod, host, staged), by direction (read: into device memory).",
		[]string{"transport", "direction"}, nil)
	return c
}

// MetricName is the Prometheus name of a counter of the table:
// phxmount_NAME for a gauge, phxmount_NAME_total for a growing total.
func MetricName(d client.CounterDesc) string {
	if d.Gauge {
		return Namespace + "_" + d.Name
	}
	return Namespace + "_" + d.Name + "_total"
}

// helpText is a counter's doc without the Markdown.
func helpText(doc string) string {
	return strings.ToUpper(doc[:1]) + strings.ReplaceAll(doc[1:], "`", "") + "."
}

func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range c.counters {
		ch <- d
	}
	ch <- c.transport
}

func (c *collector) Collect(ch chan<- prometheus.Metric) {
	cs := c.src.Counters()
	i := 0
	cs.Each(func(_ string, v uint64) {
		kind := prometheus.CounterValue
		if c.descs[i].Gauge {
			kind = prometheus.GaugeValue
		}
		ch <- prometheus.MustNewConstMetric(c.counters[i], kind, float64(v))
		i++
	})
	for _, t := range c.src.TransportStats() {
		ch <- prometheus.MustNewConstMetric(c.transport, prometheus.CounterValue, float64(t.BytesRead), string(t.Transport), "read")
		ch <- prometheus.MustNewConstMetric(c.transport, prometheus.CounterValue, float64(t.BytesWritten), string(t.Transport), "write")
	}
}
