package main

import (
	"bytes"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"fmt"
	"math"
)

// musicParams are the validated parameters of a music task.
type musicParams struct {
	Prompt  string `json:"prompt"`
	Seconds int    `json:"seconds"`
}

const (
	maxSeconds = 5
	sampleRate = 8000
)

// renderWAV makes a short 8-bit mono WAV: two tones picked by a SHA-256 of
// the parameters, so the same prompt always gives the same bytes.
func renderWAV(p musicParams) []byte {
	seed := sha256.Sum256([]byte(fmt.Sprintf("%d:%s|%d", len(p.Prompt), p.Prompt, p.Seconds)))
	f1 := 220 + float64(binary.BigEndian.Uint16(seed[0:2])%440)
	f2 := f1 * (1.25 + float64(seed[2]%4)*0.25)
	n := p.Seconds * sampleRate
	var b bytes.Buffer
	b.WriteString("RIFF")
	binary.Write(&b, binary.LittleEndian, uint32(36+n))
	b.WriteString("WAVEfmt ")
	for _, v := range []any{uint32(16), uint16(1), uint16(1), // PCM, mono
		uint32(sampleRate), uint32(sampleRate), uint16(1), uint16(8)} { // 1 byte a sample
		binary.Write(&b, binary.LittleEndian, v)
	}
	b.WriteString("data")
	binary.Write(&b, binary.LittleEndian, uint32(n))
	for i := range n {
		t := float64(i) / sampleRate
		f := f1
		if int(t*4)%2 == 1 {
			f = f2
		}
		b.WriteByte(byte(128 + 60*math.Sin(2*math.Pi*f*t)))
	}
	return b.Bytes()
}

func wavDataURL(wav []byte) string {
	return "data:audio/wav;base64," + base64.StdEncoding.EncodeToString(wav)
}
