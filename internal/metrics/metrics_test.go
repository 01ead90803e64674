package metrics

import (
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"golang.org/x/sys/unix"

	"github.com/phxmount/phxmount/client"
	"github.com/phxmount/phxmount/internal/buildinfo"
	"github.com/phxmount/phxmount/phxfs"
)

// fakeSource hands out counters the test sets.
type fakeSource struct {
	mu  sync.Mutex
	c   client.Counters
	xpt []phxfs.TransportBytes
}

func (f *fakeSource) Counters() client.Counters {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.c
}

func (f *fakeSource) TransportStats() []phxfs.TransportBytes {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]phxfs.TransportBytes(nil), f.xpt...)
}

func serve(t *testing.T, src Source) (*Metrics, *Server) {
	t.Helper()
	m, err := New(src, buildinfo.Info{Version: "v1.2.3", Commit: "abc", GoVersion: "go1.26"})
	if err != nil {
		t.Fatal(err)
	}
	s, err := m.Serve("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Error(err)
		}
	})
	return m, s
}

// scrape fetches and parses the endpoint as Prometheus would.
func scrape(t *testing.T, s *Server) map[string]*dto.MetricFamily {
	t.Helper()
	resp, err := http.Get(s.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); resp.StatusCode != 200 || !strings.HasPrefix(ct, "text/plain") {
		t.Fatalf("status %d, content type %q", resp.StatusCode, ct)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("not Prometheus text: %v", err)
	}
	return fams
}

func value(t *testing.T, fams map[string]*dto.MetricFamily, name string, labels ...string) float64 {
	t.Helper()
	f := fams[name]
	if f == nil {
		t.Fatalf("no metric %s", name)
	}
	for _, m := range f.Metric {
		got := []string{}
		for _, l := range m.Label {
			got = append(got, l.GetName()+"="+l.GetValue())
		}
		if strings.Join(got, ",") != strings.Join(labels, ",") {
			continue
		}
		switch f.GetType() {
		case dto.MetricType_COUNTER:
			return m.Counter.GetValue()
		case dto.MetricType_GAUGE:
			return m.Gauge.GetValue()
		}
	}
	t.Fatalf("no %s{%s}", name, strings.Join(labels, ","))
	return 0
}

// TestEveryCounter: every counter of the table is a metric, with its
// value, its type (gauge or counter) and its doc as help; a counter moves
// between scrapes by exactly what the source's moved.
func TestEveryCounter(t *testing.T) {
	src := &fakeSource{}
	for i, name := range client.CounterNames() {
		src.c.Set(name, uint64(1000*(i+1)))
	}
	_, s := serve(t, src)
	fams := scrape(t, s)
	for i, d := range client.CounterDescs() {
		name := MetricName(d)
		f := fams[name]
		if f == nil {
			t.Errorf("counter %s: no metric %s", d.Name, name)
			continue
		}
		want := dto.MetricType_COUNTER
		if d.Gauge {
			want = dto.MetricType_GAUGE
		}
		if f.GetType() != want || !strings.Contains(f.GetHelp(), strings.ReplaceAll(d.Doc, "`", "")[1:]) {
			t.Errorf("%s: type %v help %q", name, f.GetType(), f.GetHelp())
		}
		if v := value(t, fams, name); v != float64(1000*(i+1)) {
			t.Errorf("%s = %v, want %d", name, v, 1000*(i+1))
		}
	}
	src.mu.Lock()
	src.c.IoctlBytesRead += 4097
	src.mu.Unlock()
	before := value(t, fams, "phxmount_ioctl_bytes_read_total")
	if d := value(t, scrape(t, s), "phxmount_ioctl_bytes_read_total") - before; d != 4097 {
		t.Errorf("the byte counter moved by %v, want 4097", d)
	}
}

// TestTransportsHistogramBuild: bytes per transport and direction, the
// ioctl histogram by command, the request histogram by request, and the
// build's labels.
func TestTransportsHistogramBuild(t *testing.T) {
	src := &fakeSource{xpt: []phxfs.TransportBytes{{Transport: phxfs.Staged, BytesRead: 5, BytesWritten: 6}, {Transport: phxfs.Host, BytesRead: 7}}}
	m, s := serve(t, src)
	m.ObserveIoctl("read", 30*time.Microsecond)
	m.ObserveIoctl("read", 3*time.Millisecond)
	m.ObserveIoctl("batch_read", time.Second)
	m.ObserveRequest("open", 20*time.Microsecond)
	m.ObserveRequest("flush", 2*time.Second)
	fams := scrape(t, s)
	for _, c := range []struct {
		labels []string
		want   float64
	}{{[]string{"direction=read", "transport=staged"}, 5}, {[]string{"direction=write", "transport=staged"}, 6}, {[]string{"direction=read", "transport=host"}, 7}} {
		if v := value(t, fams, "phxmount_transport_bytes_total", c.labels...); v != c.want {
			t.Errorf("transport bytes %v = %v, want %v", c.labels, v, c.want)
		}
	}
	h := fams["phxmount_ioctl_duration_seconds"]
	if h == nil || h.GetType() != dto.MetricType_HISTOGRAM {
		t.Fatalf("no ioctl histogram: %v", h)
	}
	counts := map[string]uint64{}
	for _, mm := range h.Metric {
		counts[mm.Label[0].GetValue()] = mm.Histogram.GetSampleCount()
		if mm.Label[0].GetValue() == "read" && mm.Histogram.Bucket[0].GetCumulativeCount() != 1 {
			t.Errorf("the 30 µs read is not in the first bucket: %v", mm.Histogram.Bucket[0])
		}
	}
	if counts["read"] != 2 || counts["batch_read"] != 1 {
		t.Errorf("histogram counts %v", counts)
	}
	h = fams["phxmount_request_duration_seconds"]
	if h == nil || h.GetType() != dto.MetricType_HISTOGRAM {
		t.Fatalf("no request histogram: %v", h)
	}
	for _, mm := range h.Metric {
		b := mm.Histogram.Bucket
		switch mm.Label[0].GetValue() {
		case "open": // 20 µs: above the first bound (10 µs), within the second
			if b[0].GetCumulativeCount() != 0 || b[1].GetCumulativeCount() != 1 {
				t.Errorf("the 20 µs open: %v", b[:2])
			}
		case "flush": // 2 s: within the last bound (about 2.6 s)
			last := len(RequestBuckets) - 1
			if b[last-1].GetCumulativeCount() != 0 || b[last].GetCumulativeCount() != 1 {
				t.Errorf("the 2 s flush: %v", b)
			}
		default:
			t.Errorf("request %q observed", mm.Label[0].GetValue())
		}
	}
	if v := value(t, fams, "phxmount_build_info", "commit=abc", "goversion=go1.26", "version=v1.2.3"); v != 1 {
		t.Errorf("build_info = %v", v)
	}
	if fams["go_goroutines"] == nil || fams["process_open_fds"] == nil {
		t.Errorf("no Go runtime or process metrics")
	}
}

// TestServer: the index answers, other paths are 404, a taken address is
// an error, and Close stops serving.
// TestServeBindsLoopbackWithoutHost: ":PORT" listens on 127.0.0.1 only
// (the endpoint has no authentication); an explicit host is taken as
// given.
func TestServeBindsLoopbackWithoutHost(t *testing.T) {
	m, err := New(&fakeSource{}, buildinfo.Info{})
	if err != nil {
		t.Fatal(err)
	}
	for addr, want := range map[string]string{":0": "127.0.0.1", "0.0.0.0:0": "0.0.0.0"} {
		s, err := m.Serve(addr)
		if err != nil {
			t.Fatalf("Serve(%q): %v", addr, err)
		}
		if host, _, _ := net.SplitHostPort(s.Addr().String()); host != want {
			t.Errorf("Serve(%q) listens on %s, want host %s", addr, s.Addr(), want)
		}
		if err := s.Close(); err != nil {
			t.Error(err)
		}
	}
}

func TestServer(t *testing.T) {
	_, s := serve(t, &fakeSource{})
	if !s.Loopback() {
		t.Errorf("%s: not loopback", s.Addr())
	}
	base := "http://" + s.Addr().String()
	for path, want := range map[string]int{"/": 200, "/nope": 404} {
		resp, err := http.Get(base + path)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != want || (want == 200 && !strings.Contains(string(b), "/metrics")) {
			t.Errorf("GET %s: %d %q", path, resp.StatusCode, b)
		}
	}
	m, err := New(&fakeSource{}, buildinfo.Info{})
	if err != nil {
		t.Fatal(err)
	}
	if s2, err := m.Serve(s.Addr().String()); err == nil {
		s2.Close()
		t.Fatalf("a second server on %s", s.Addr())
	} else if !strings.Contains(err.Error(), "metrics: listen "+s.Addr().String()) {
		t.Errorf("error %q", err)
	}
	if _, err := m.Serve("9464"); err == nil || !errors.Is(err, unix.EINVAL) {
		t.Errorf("an address with no port: %v, want EINVAL", err)
	}
	s3, err := m.Serve("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	if err := s3.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := http.Get(s3.URL()); err == nil {
		t.Errorf("still serving after Close")
	}
}
