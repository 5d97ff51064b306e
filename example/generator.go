package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"image"
	"image/color"
	"image/png"
	"strings"
	"time"
)

// Prompt markers make the stand-in generator misbehave on purpose, so that
// every task state can be reached by hand.
const (
	markerFail    = "#fail"    // the upstream refuses: the task fails
	markerTimeout = "#timeout" // the upstream times out: the task becomes uncertain, then is reconciled
	markerEmpty   = "#empty"   // the upstream answers with no images: succeeded, projected as failed
	markerPartial = "#partial" // the upstream fails after the first image: failed with partial results
)

// Errors of the stand-in upstream, as a real client library would return them.
var (
	errUpstreamRefused = errors.New("upstream refused the prompt (#fail)")
	errUpstreamTimeout = errors.New("upstream did not answer in time (#timeout)")
)

// partialError is a failure after some images were made.
type partialError struct {
	made [][]byte
}

func (e *partialError) Error() string {
	return fmt.Sprintf("upstream failed after %d image(s) (#partial)", len(e.made))
}

// imageParams are the validated parameters of an image task, as stored in
// the task row (client_note is not kept).
type imageParams struct {
	Prompt         string `json:"prompt"`
	AspectRatio    string `json:"aspect_ratio"`
	N              int    `json:"n"`
	ReferenceImage string `json:"reference_image,omitempty"`
}

// generator is the stand-in for an image model behind an API: it takes
// a while and answers with real PNGs, deterministic from the parameters.
type generator struct {
	// took is how long one generation takes.
	took time.Duration
}

// wait takes the generator's time, or less if ctx ends.
func (g generator) wait(ctx context.Context) error {
	t := time.NewTimer(g.took)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// generate renders images from..p.N-1 of p after g.took (from > 0 resumes
// a task that kept partial results), or fails as the prompt's markers ask.
func (g generator) generate(ctx context.Context, p imageParams, from int) ([][]byte, error) {
	if err := g.wait(ctx); err != nil {
		return nil, err
	}
	switch {
	case strings.Contains(p.Prompt, markerFail):
		return nil, errUpstreamRefused
	case strings.Contains(p.Prompt, markerTimeout):
		return nil, errUpstreamTimeout
	case strings.Contains(p.Prompt, markerEmpty):
		return nil, nil
	}
	out := make([][]byte, 0, p.N)
	for i := from; i < p.N; i++ {
		b, err := renderPNG(p, i)
		if err != nil {
			return nil, err
		}
		out = append(out, b)
		// #partial fails once, after the first image; a recovered task
		// (from > 0) then completes.
		if from == 0 && strings.Contains(p.Prompt, markerPartial) {
			return nil, &partialError{made: out}
		}
	}
	return out, nil
}

// reconcile asks the stand-in upstream what became of a request that timed
// out: it did finish, late, so the task gets the images it would have had.
func (g generator) reconcile(p imageParams) ([][]byte, error) {
	out := make([][]byte, 0, p.N)
	for i := range p.N {
		b, err := renderPNG(p, i)
		if err != nil {
			return nil, err
		}
		out = append(out, b)
	}
	return out, nil
}

// aspectSizes are the pixel sizes of the supported aspect ratios.
var aspectSizes = map[string]image.Point{
	"1:1":  {128, 128},
	"16:9": {160, 90},
	"9:16": {90, 160},
	"4:3":  {128, 96},
	"3:4":  {96, 128},
}

// renderPNG draws image i of p: a palette and a pattern of rings and bands
// chosen by a SHA-256 of the parameters, so the same parameters always give
// the same bytes and a changed prompt visibly changes the picture.
func renderPNG(p imageParams, i int) ([]byte, error) {
	size, ok := aspectSizes[p.AspectRatio]
	if !ok {
		return nil, fmt.Errorf("render: unsupported aspect ratio %q", p.AspectRatio)
	}
	h := sha256.New()
	fmt.Fprintf(h, "%d:%s|%s|%d|", len(p.Prompt), p.Prompt, p.AspectRatio, i)
	h.Write([]byte(p.ReferenceImage))
	seed := h.Sum(nil)

	pal := make(color.Palette, 8)
	for j := range pal {
		pal[j] = color.RGBA{seed[3*j], seed[3*j+1], seed[3*j+2], 0xff}
	}
	img := image.NewPaletted(image.Rect(0, 0, size.X, size.Y), pal)
	cx := int(seed[24]) % size.X
	cy := int(seed[25]) % size.Y
	ring := 6 + int(seed[26]%10)
	band := 5 + int(seed[27]%12)
	slope := int(binary.BigEndian.Uint16(seed[28:30])%5) - 2
	for y := range size.Y {
		for x := range size.X {
			dx, dy := x-cx, y-cy
			r := isqrt(dx*dx + dy*dy)
			v := r/ring + (y+slope*x+2*size.X)/band
			img.SetColorIndex(x, y, uint8(v%len(pal)))
		}
	}
	var buf bytes.Buffer
	if err := (&png.Encoder{CompressionLevel: png.BestCompression}).Encode(&buf, img); err != nil {
		return nil, fmt.Errorf("render: %w", err)
	}
	return buf.Bytes(), nil
}

func isqrt(n int) int {
	if n <= 0 {
		return 0
	}
	x := n
	y := (x + 1) / 2
	for y < x {
		x = y
		y = (x + n/x) / 2
	}
	return x
}

// dataURL wraps PNG bytes as a data URL.
func dataURL(png []byte) string {
	return "data:image/png;base64," + base64.StdEncoding.EncodeToString(png)
}
