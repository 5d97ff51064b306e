package main

import (
	"bytes"
	"fmt"
	"image/png"
)

// The stand-in generator draws real PNGs, deterministic from the
// parameters: the same prompt always gives the same bytes.
func Example_renderPNG() {
	p := imageParams{Prompt: "a lighthouse at dawn", AspectRatio: "16:9", N: 1}
	a, _ := renderPNG(p, 0)
	b, _ := renderPNG(p, 0)
	img, _ := png.Decode(bytes.NewReader(a))
	fmt.Println(img.Bounds().Size(), bytes.Equal(a, b))
	// Output: (160,90) true
}
