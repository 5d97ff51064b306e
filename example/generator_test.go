package main

import (
	"bytes"
	"context"
	"errors"
	"image/png"
	"testing"
)

func TestGenerator(t *testing.T) {
	t.Parallel()
	g := generator{}
	tests := []struct {
		name      string
		given     imageParams
		whenFrom  int
		wantN     int
		wantErr   error
		wantParts int // images kept by a partial failure
	}{
		{name: "n images", given: imageParams{Prompt: "a cat", AspectRatio: "4:3", N: 3}, wantN: 3},
		{name: "fail", given: imageParams{Prompt: "a cat #fail", AspectRatio: "1:1", N: 1}, wantErr: errUpstreamRefused},
		{name: "timeout", given: imageParams{Prompt: "#timeout a cat", AspectRatio: "1:1", N: 1}, wantErr: errUpstreamTimeout},
		{name: "empty", given: imageParams{Prompt: "a cat #empty", AspectRatio: "1:1", N: 2}, wantN: 0},
		{name: "partial fails after one", given: imageParams{Prompt: "a cat #partial", AspectRatio: "1:1", N: 3}, wantParts: 1},
		{name: "partial resumed completes", given: imageParams{Prompt: "a cat #partial", AspectRatio: "1:1", N: 3}, whenFrom: 1, wantN: 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, err := g.generate(context.Background(), tt.given, tt.whenFrom)
			var partial *partialError
			switch {
			case tt.wantErr != nil:
				if !errors.Is(err, tt.wantErr) {
					t.Fatalf("err = %v, want %v", err, tt.wantErr)
				}
			case tt.wantParts > 0:
				if !errors.As(err, &partial) || len(partial.made) != tt.wantParts {
					t.Fatalf("err = %v, want a partial failure with %d images", err, tt.wantParts)
				}
			case err != nil || len(got) != tt.wantN:
				t.Fatalf("generate = %d images, %v; want %d", len(got), err, tt.wantN)
			}
			for i, b := range got {
				if _, err := png.Decode(bytes.NewReader(b)); err != nil {
					t.Errorf("image %d is not a PNG: %v", i, err)
				}
			}
		})
	}
}

func TestRenderPNGIsDeterministic(t *testing.T) {
	t.Parallel()
	p := imageParams{Prompt: "a lighthouse", AspectRatio: "16:9", N: 1}
	a, _ := renderPNG(p, 0)
	b, _ := renderPNG(p, 0)
	if !bytes.Equal(a, b) {
		t.Fatal("same parameters rendered different bytes")
	}
	for _, other := range []imageParams{
		{Prompt: "a lighthouse ", AspectRatio: "16:9"},
		{Prompt: "a lighthouse", AspectRatio: "16:9", ReferenceImage: "https://example.com/x.png"},
	} {
		c, _ := renderPNG(other, 0)
		if bytes.Equal(a, c) {
			t.Errorf("%+v rendered the same bytes as %+v", other, p)
		}
	}
	if second, _ := renderPNG(p, 1); bytes.Equal(a, second) {
		t.Error("image 1 equals image 0")
	}
}
