package imaging

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"hash/crc32"
	"image"
	"image/color"
	"image/gif"
	"image/jpeg"
	"image/png"
	"testing"
	"time"
)

func TestSniff(t *testing.T) {
	cases := map[string]string{
		"\xff\xd8\xff\xe0rest":        "image/jpeg",
		"\x89PNG\r\n\x1a\n....":       "image/png",
		"GIF89a......":                "image/gif",
		"GIF87a......":                "image/gif",
		"RIFF\x10\x00\x00\x00WEBPVP8": "image/webp",
		"RIFF\x10\x00\x00\x00WAVE":    "",
		"<html><body>":                "",
		"":                            "",
		"not an image 0.1":            "",
	}
	for in, want := range cases {
		if got := Sniff([]byte(in)); got != want {
			t.Errorf("Sniff(%q) = %q, want %q", in, got, want)
		}
	}
}

func pngOf(t *testing.T, w, h int) []byte {
	img := image.NewNRGBA(image.Rect(0, 0, w, h))
	for y := 0; y < h; y++ {
		for x := 0; x < w; x++ {
			img.Set(x, y, color.NRGBA{uint8(x), uint8(y), 90, 255})
		}
	}
	var buf bytes.Buffer
	if err := png.Encode(&buf, img); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func TestRenderIsDeterministicAndBounded(t *testing.T) {
	data := pngOf(t, 700, 300)
	names := []string{"thumbnail", "crop", "optimized"}
	a, err := Render(context.Background(), data, names, DefaultLimits, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := Render(context.Background(), data, names, DefaultLimits, 5*time.Second)
	for i, o := range a {
		if o.SHA256 != b[i].SHA256 {
			t.Errorf("%s: output differs between runs", o.Name)
		}
		if o.ContentType != "image/jpeg" {
			t.Errorf("%s: opaque input should give JPEG, got %s", o.Name, o.ContentType)
		}
	}
	if a[0].Width != 320 || a[0].Height != 137 {
		t.Errorf("thumbnail %dx%d", a[0].Width, a[0].Height)
	}
	if a[1].Width != a[1].Height || a[1].Width != 300 {
		t.Errorf("crop %dx%d", a[1].Width, a[1].Height)
	}
	if a[2].Width != 700 {
		t.Errorf("optimized must not upscale: %d", a[2].Width)
	}
	if _, err := jpeg.Decode(bytes.NewReader(a[0].Data)); err != nil {
		t.Errorf("thumbnail is not a JPEG: %v", err)
	}
}

func TestHugeDimensionsRefusedBeforeDecoding(t *testing.T) {
	// A PNG header claiming 50 000 × 50 000 pixels: only the header is read.
	data := pngOf(t, 1, 1)
	copy(data[16:24], []byte{0, 0, 0xC3, 0x50, 0, 0, 0xC3, 0x50})
	binary.BigEndian.PutUint32(data[29:33], crc32.ChecksumIEEE(data[12:29])) // IHDR CRC
	_, err := Render(context.Background(), data, []string{"thumbnail"}, DefaultLimits, time.Second)
	var perr *Error
	if !errors.As(err, &perr) || perr.Code != "image-too-large" {
		t.Fatalf("want image-too-large, got %v", err)
	}
}

func TestGarbagePixelsArePermanent(t *testing.T) {
	data := pngOf(t, 40, 40)
	i := bytes.Index(data, []byte("IDAT")) + 6
	for j := i; j < len(data)-16; j++ {
		data[j] ^= 0x5A
	}
	_, err := Render(context.Background(), data, []string{"thumbnail"}, DefaultLimits, time.Second)
	var perr *Error
	if !errors.As(err, &perr) || perr.Code != "image-undecodable" {
		t.Fatalf("want image-undecodable, got %v", err)
	}
}

func TestGIFFrameCap(t *testing.T) {
	pal := color.Palette{color.Black, color.White}
	anim := &gif.GIF{}
	for i := 0; i < 5; i++ {
		anim.Image = append(anim.Image, image.NewPaletted(image.Rect(0, 0, 4, 4), pal))
		anim.Delay = append(anim.Delay, 1)
	}
	var buf bytes.Buffer
	if err := gif.EncodeAll(&buf, anim); err != nil {
		t.Fatal(err)
	}
	if n, err := gifFrames(buf.Bytes()); err != nil || n != 5 {
		t.Fatalf("gifFrames = %d, %v", n, err)
	}
	_, _, err := Check(buf.Bytes(), Limits{MaxPixels: 100, MaxSide: 10, MaxFrames: 3})
	var perr *Error
	if !errors.As(err, &perr) || perr.Code != "too-many-frames" {
		t.Fatalf("want too-many-frames, got %v", err)
	}
}

func TestOrient(t *testing.T) {
	src := image.NewNRGBA(image.Rect(0, 0, 3, 2))
	src.Set(0, 0, color.NRGBA{255, 0, 0, 255})
	got := orient(src, 6) // rotate 90° clockwise
	if b := got.Bounds(); b.Dx() != 2 || b.Dy() != 3 {
		t.Fatalf("bounds %v", b)
	}
	if r, _, _, _ := got.At(1, 0).RGBA(); r != 0xffff {
		t.Error("top-left pixel should land top-right after a 90° turn")
	}
}
