package fusefs

import (
	"context"
	"encoding/binary"
	"fmt"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/phxmount/phxmount/client"
)

// FuzzControlIoctl throws arbitrary commands and payloads at the server with
// a registered buffer: it must not panic, must answer foreign commands with
// ENOTTY, and a READ it accepts must land exactly where it said.
func FuzzControlIoctl(f *testing.F) {
	e := newCtlEnv(f, false, false)
	of, data, m, r := e.served(f, 1<<20, unix.O_RDWR, 1<<20)
	if r.ID != 1 {
		f.Fatalf("register: id %d", r.ID)
	}
	f.Add(client.CmdRead, client.EncodeIO(client.IOReq{ID: 1, BufOffset: 8, Length: 4096, FileOffset: 64}))
	f.Add(client.CmdWrite, client.EncodeIO(client.IOReq{ID: 1, Length: 4096, FileOffset: 1 << 20}))
	b, _ := client.EncodeBatch(2, []client.IOReq{{ID: 1, Length: 100}, {ID: 2, Length: 1}})
	f.Add(client.CmdBatch(false, 2), b)
	f.Add(client.CmdInfo, client.EncodeInfoReq(0))
	f.Add(client.CmdDeregister, client.EncodeDeregister(99))
	f.Add(client.CmdRegister, client.EncodeRegister(client.RegisterReq{Size: 65536}))
	f.Add(uint32(0x5401), []byte{})
	f.Fuzz(func(t *testing.T, cmd uint32, in []byte) {
		if client.ParseCmd(cmd).Nr == client.NrDeregister {
			// Keep buffer 1 alive for the other inputs.
			if id, err := client.DecodeDeregister(in); err == nil && id == 1 {
				return
			}
		}
		out := make([]byte, len(in))
		_, errno := e.s.Ioctl(context.Background(), e.me, of, cmd, in, out)
		ours, _ := client.Known(cmd)
		if !ours && errno != unix.ENOTTY {
			t.Fatalf("foreign command %#x: %v", cmd, errno)
		}
		if errno == 0 && cmd == client.CmdRead {
			req, _ := client.DecodeIO(in)
			n, _ := client.DecodeIOResp(out)
			if n < 0 || uint64(n) > req.Length || req.BufOffset+uint64(n) > 1<<20 {
				t.Fatalf("READ %+v returned %d", req, n)
			}
			mem := m.Bytes()
			for i := uint64(0); i+8 <= uint64(n); i += 8 {
				fo := req.FileOffset + i
				if fo%8 == 0 && fo+8 <= uint64(len(data)) {
					if got := binary.LittleEndian.Uint64(mem[req.BufOffset+i:]); got != fo {
						// The file may have been changed by a fuzzed WRITE.
						var w [8]byte
						unix.Pread(of.Fd, w[:], int64(fo))
						if got != binary.LittleEndian.Uint64(w[:]) {
							t.Fatalf("READ %+v: word at %d is %d", req, fo, got)
						}
					}
				}
			}
		}
	})
}

// FuzzParseLoad fuzzes the user.phx.load value parser.
func FuzzParseLoad(f *testing.F) {
	tok := strings.Repeat("ab", 16)
	f.Add("token=" + tok + ",offset=0")
	f.Add("token=" + tok + ",offset=0x1000,length=4096,file_offset=8192")
	f.Add("token=" + tok + ",offset=0,offset=1")
	f.Add("offset=-1,token=zz")
	f.Add("")
	f.Fuzz(func(t *testing.T, v string) {
		r, err := parseLoad([]byte(v))
		if err != nil {
			if !strings.Contains(err.Error(), unix.EINVAL.Error()) {
				t.Fatalf("error %v is not EINVAL", err)
			}
			return
		}
		if r.offset > client.MaxOffset || r.length > client.MaxOffset || r.fileOffset > client.MaxOffset {
			t.Fatalf("accepted %+v", r)
		}
		if !strings.Contains(strings.ToLower(v), fmt.Sprintf("%x", r.token[:])) {
			t.Fatalf("token %x not in %q", r.token[:], v)
		}
	})
}
