// Package phxfs is the Go libphoenix: it moves bytes between files and
// device (GPU) memory without a host "phony buffer" where the machine
// allows it, and through pinned bounce buffers where it does not. It sits
// between the FUSE daemon's control protocol (package fusefs) and two
// lower layers: an I/O engine and worker pool (package ioengine: io_uring,
// or pread/pwrite) and a vendor connector (package connector: nvidia, emu,
// pcibar), plus the phxfs kernel module where it is loaded (package kmod).
//
// # A read, from the ioctl to device memory
//
// fusefs decodes a READ or BATCH_READ ioctl, checks every extent against
// the caller's buffer, holds that buffer's Registration and hands the
// extents to ReadBatch as Requests. From there:
//
//  1. Registration (mem.go). Device memory is registered once (RegMem, or
//     Import for memory another process exported): a region is the one
//     object for it, with one life, and each RegMem or Import returns a
//     Registration, a reference to it. The region knows its transport
//     and, for the kmod and host transports, the host address where I/O
//     lands. Transfers hold it; closing a reference waits for the holds
//     taken through it (a caller's own I/O), and the last reference's
//     close waits for every hold to drain (users.go), then unmaps it.
//     Memory imported read-only is never read into (EACCES).
//  2. Plan (plan.go). prepare resolves each Request (resolve: check it,
//     hold its registration, find where its bytes go; a request whose
//     buffer does not resolve gets -EFAULT and never reaches the engine),
//     orders them by file and offset, and cuts them into engine transfers:
//     requests that follow on in both the file and the buffer merge into
//     one (KV-cache blocks read head by head), and a transfer is at most
//     ChunkSize (1 GiB), the bounce buffer (staged) or Config.SplitSize.
//  3. Transfer (io.go). execute runs the plan in rounds on the worker pool,
//     so other batches (other devices, other clients) interleave with a
//     large one; finish turns transfer results into request results and
//     releases the holds. A transfer starts "not run" and every path that
//     runs it sets its result; one left unrun fails its request with EIO,
//     so a short count only ever means end of file.
//  4. Transport. Each registration's transport decides how the bytes of a
//     transfer reach device memory:
//     - kmod (kernel.go): the phxfs kernel module maps the device memory
//     into a VMA backed by device pages; an O_DIRECT read into it is DMA
//     from storage into device memory.
//     - host: the memory is host-addressable (the emu connector); the
//     engine reads straight into it.
//     - staged (staged.go, staged_read.go, staged_write.go, policy.go):
//     each worker reads into its slots, pinned bounce buffers made once
//     when staged memory is first registered. A slot holds one large
//     transfer or many small ones packed together (KV-cache blocks); the
//     connector moves a whole slot with one scatter (NVIDIA: one copy and
//     a kernel, or one batched copy) ended by a fence, while the worker
//     fills the next. Ranges the page cache holds are read through it,
//     cold ones with O_DIRECT (the ODirect policy), so a load never evicts
//     the cache. A copy error fails the transfers whose bytes it concerns
//     only: a slot whose copy fails is moved again piece by piece.
//     Placement (placement.go) decides which workers run a staged plan: a
//     small batch runs on a few workers only (stagedWorkers), so
//     concurrent batches run beside it (split by load, StagedByLoad, a
//     batch beside other plans of its device takes no more than its fair
//     part of the pool, down to a slot's worth a worker: one scatter and
//     one fence a share), and devices
//     loading at the same
//     time split the pool, device rank r of k getting workers
//     [r·W/k, (r+1)·W/k), so that each GPU's copy engine is kept busy. A
//     read plan's workers claim its transfers a chunk at a time (claimer);
//     a worker that the placement has since given to another device may
//     leave the plan to the others, except the last one, which claims
//     whatever is left.
//     The device's transport is the fastest the machine offers (kmod, then
//     host, then staged); Device and TransportFor say which, and why.
//
// Writes run the same way in the other direction.
//
// # The libphoenix reference, rule by rule
//
// Each rule of the libphoenix API, and the code that keeps it here:
//   - open and close reference-count a device; the last close drains the
//     device's I/O, then unmaps every registration; an open racing it gets
//     EBUSY: OpenDevice, CloseDevice (device.go).
//   - regmem and deregmem take non-zero multiples of the 64 KiB device
//     page; an exact duplicate adds a reference, any other overlap is
//     EINVAL; a deregister waits for its own holds, the last one drains
//     the registration's I/O: RegMem, DeregMem, Registration.Close
//     (mem.go).
//   - read and write resolve a buffer anywhere inside a registration
//     (device >= 0) or take a host address (device < 0), hold the
//     registration for the transfer and cut it at 1 GiB: Read, Write
//     (io.go), resolve and cut (plan.go).
//   - the batch API: per-request results, 0 or the number of failures, a
//     submission-level error only when nothing ran; asynchronous submit,
//     wait and destroy over a bounded FIFO (EBUSY when full); an empty
//     batch is valid: ReadBatch, WriteBatch, SubmitRead, SubmitWrite,
//     Batch.Wait, Batch.Destroy (batch.go).
//   - the engine (io_uring with QD 1024 per worker, sync fallback per
//     worker, its name) and the worker pool: package ioengine;
//     Lib.EngineName and Lib.EngineFallback report them.
package phxfs
