package imaging

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"image"
	"image/color"
	"image/jpeg"
	"image/png"
	"time"

	"golang.org/x/image/draw"
)

// Output is one rendered variant.
type Output struct {
	Name        string
	Ext         string
	ContentType string
	Data        []byte
	SHA256      string
	Width       int
	Height      int
}

// Bounds of each variant (longest side, or the side of the square crop).
const (
	thumbnailSide = 320
	cropSide      = 512
	optimizedSide = 1600
	jpegQuality   = 82
)

// Render decodes data (after Check) and produces the named variants. Same
// input, same output bytes: encoders here are deterministic and no metadata
// (EXIF, timestamps) is copied. The decode runs under limit; a decode still
// running then is abandoned and reported as a permanent failure.
func Render(ctx context.Context, data []byte, variants []string, l Limits, limit time.Duration) ([]Output, error) {
	if _, _, err := Check(data, l); err != nil {
		return nil, err
	}
	type decoded struct {
		img image.Image
		err error
	}
	done := make(chan decoded, 1)
	go func() {
		img, _, err := image.Decode(bytes.NewReader(data))
		done <- decoded{img, err}
	}()
	var src image.Image
	timer := time.NewTimer(limit)
	defer timer.Stop()
	select {
	case d := <-done:
		if d.err != nil {
			return nil, permanent("image-undecodable", d.err)
		}
		src = d.img
	case <-timer.C:
		return nil, permanent("decode-timeout", fmt.Errorf("decoding took longer than %s", limit))
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	src = orient(src, jpegOrientation(data))
	opaque := isOpaque(src)
	// One expensive downscale of the full image; the smaller variants are
	// derived from its result (same region, far fewer pixels to filter).
	base := fit(src, optimizedSide)
	out := make([]Output, 0, len(variants))
	for _, name := range variants {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		var img image.Image
		switch name {
		case "thumbnail":
			img = fit(base, thumbnailSide)
		case "crop":
			img = fit(centerSquare(base), cropSide)
		case "optimized":
			img = base
		default:
			return nil, permanent("unknown-variant", fmt.Errorf("variant %q", name))
		}
		o, err := encode(name, img, opaque)
		if err != nil {
			return nil, permanent("encode-error", err)
		}
		out = append(out, o)
	}
	return out, nil
}

func encode(name string, img image.Image, opaque bool) (Output, error) {
	var buf bytes.Buffer
	o := Output{Name: name, Width: img.Bounds().Dx(), Height: img.Bounds().Dy()}
	if opaque {
		o.Ext, o.ContentType = "jpg", "image/jpeg"
		if err := jpeg.Encode(&buf, img, &jpeg.Options{Quality: jpegQuality}); err != nil {
			return o, err
		}
	} else {
		o.Ext, o.ContentType = "png", "image/png"
		enc := png.Encoder{CompressionLevel: png.DefaultCompression}
		if err := enc.Encode(&buf, img); err != nil {
			return o, err
		}
	}
	if buf.Len() == 0 {
		return o, errors.New("empty output")
	}
	sum := sha256.Sum256(buf.Bytes())
	o.Data, o.SHA256 = buf.Bytes(), hex.EncodeToString(sum[:])
	return o, nil
}

// fit scales src down so that its longest side is at most side (never up).
// Large reductions go by halves (each a 2×2 average, which filters properly
// at exactly 2×), then one bilinear step of less than 2×: a mip-map chain
// that costs a small multiple of the output, not of the input.
func fit(src image.Image, side int) image.Image {
	b := src.Bounds()
	w, h := b.Dx(), b.Dy()
	if w <= side && h <= side {
		return toRGBA(src)
	}
	for max(w, h) >= 2*side {
		src = scale(src, max(1, w/2), max(1, h/2))
		w, h = src.Bounds().Dx(), src.Bounds().Dy()
	}
	if w >= h {
		h, w = max(1, h*side/w), side
	} else {
		w, h = max(1, w*side/h), side
	}
	return scale(src, w, h)
}

func scale(src image.Image, w, h int) *image.RGBA {
	dst := image.NewRGBA(image.Rect(0, 0, w, h)) // *image.RGBA: the scaler's fast path
	draw.ApproxBiLinear.Scale(dst, dst.Bounds(), src, src.Bounds(), draw.Src, nil)
	return dst
}

func centerSquare(src image.Image) image.Image {
	b := src.Bounds()
	side := min(b.Dx(), b.Dy())
	x0 := b.Min.X + (b.Dx()-side)/2
	y0 := b.Min.Y + (b.Dy()-side)/2
	dst := image.NewRGBA(image.Rect(0, 0, side, side))
	draw.Draw(dst, dst.Bounds(), src, image.Pt(x0, y0), draw.Src)
	return dst
}

func toRGBA(src image.Image) *image.RGBA {
	if n, ok := src.(*image.RGBA); ok && n.Rect.Min == (image.Point{}) {
		return n
	}
	b := src.Bounds()
	dst := image.NewRGBA(image.Rect(0, 0, b.Dx(), b.Dy()))
	draw.Draw(dst, dst.Bounds(), src, b.Min, draw.Src)
	return dst
}

func isOpaque(img image.Image) bool {
	if o, ok := img.(interface{ Opaque() bool }); ok {
		return o.Opaque()
	}
	b := img.Bounds()
	for y := b.Min.Y; y < b.Max.Y; y++ {
		for x := b.Min.X; x < b.Max.X; x++ {
			if _, _, _, a := img.At(x, y).RGBA(); a != 0xffff {
				return false
			}
		}
	}
	return true
}

// orient applies an EXIF orientation (1–8) so that the pixels stand upright.
func orient(src image.Image, o int) image.Image {
	if o <= 1 || o > 8 {
		return src
	}
	b := src.Bounds()
	w, h := b.Dx(), b.Dy()
	dw, dh := w, h
	if o >= 5 {
		dw, dh = h, w
	}
	dst := image.NewNRGBA(image.Rect(0, 0, dw, dh))
	for y := 0; y < h; y++ {
		for x := 0; x < w; x++ {
			var dx, dy int
			switch o {
			case 2:
				dx, dy = w-1-x, y
			case 3:
				dx, dy = w-1-x, h-1-y
			case 4:
				dx, dy = x, h-1-y
			case 5:
				dx, dy = y, x
			case 6:
				dx, dy = h-1-y, x
			case 7:
				dx, dy = h-1-y, w-1-x
			case 8:
				dx, dy = y, w-1-x
			}
			dst.Set(dx, dy, color.NRGBAModel.Convert(src.At(b.Min.X+x, b.Min.Y+y)))
		}
	}
	return dst
}
