package client

// REGISTER and DEREGISTER (docs/abi.md).

// RegisterReq is REGISTER's input.
type RegisterReq struct {
	Vendor Vendor
	Device uint32
	Size   uint64
	Handle [HandleSize]byte
}

// RegisterResp is REGISTER's output.
type RegisterResp struct {
	ID        uint64
	Token     Token
	Transport Transport
}

// EncodeRegister lays out a REGISTER request (outputs zero).
func EncodeRegister(r RegisterReq) []byte {
	b := make([]byte, RegisterSize)
	putHeader(b)
	le.PutUint32(b[8:], uint32(r.Vendor))
	le.PutUint32(b[12:], r.Device)
	le.PutUint64(b[16:], r.Size)
	copy(b[24:88], r.Handle[:])
	return b
}

// DecodeRegister checks and decodes a REGISTER request. The output fields
// (offsets 88 to 127) must be zero.
func DecodeRegister(b []byte) (RegisterReq, error) {
	if err := checkHeader(b, RegisterSize, "register"); err != nil {
		return RegisterReq{}, err
	}
	if !zero(b[88:]) {
		return RegisterReq{}, einval("register: output and reserved fields must be zero")
	}
	r := RegisterReq{Vendor: Vendor(le.Uint32(b[8:])), Device: le.Uint32(b[12:]), Size: le.Uint64(b[16:])}
	copy(r.Handle[:], b[24:88])
	return r, nil
}

// EncodeRegisterResp fills out (RegisterSize bytes) with the request echoed
// and the response.
func EncodeRegisterResp(out []byte, req RegisterReq, resp RegisterResp) {
	copy(out, EncodeRegister(req))
	le.PutUint64(out[88:], resp.ID)
	copy(out[96:112], resp.Token[:])
	le.PutUint32(out[112:], uint32(resp.Transport))
}

// DecodeRegisterResp reads REGISTER's output.
func DecodeRegisterResp(b []byte) (RegisterResp, error) {
	if err := checkHeader(b, RegisterSize, "register reply"); err != nil {
		return RegisterResp{}, err
	}
	r := RegisterResp{ID: le.Uint64(b[88:]), Transport: Transport(le.Uint32(b[112:]))}
	copy(r.Token[:], b[96:112])
	if r.ID == 0 {
		return RegisterResp{}, einval("register reply: buffer id 0")
	}
	return r, nil
}

// EncodeDeregister lays out a DEREGISTER request.
func EncodeDeregister(id uint64) []byte { return encodeOneField(DeregisterSize, 8, id) }

// DecodeDeregister checks and decodes a DEREGISTER request.
func DecodeDeregister(b []byte) (uint64, error) {
	return decodeOneField(b, DeregisterSize, 8, "deregister", "reserved fields must be zero")
}
