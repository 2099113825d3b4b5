package imaging

import (
	"bytes"
	"context"
	"image"
	"image/color"
	"image/draw"
	"image/jpeg"
	"image/png"
	"testing"
	"time"
)

func bigImage(w, h int) *image.RGBA {
	img := image.NewRGBA(image.Rect(0, 0, w, h))
	draw.Draw(img, img.Bounds(), &image.Uniform{color.RGBA{10, 80, 200, 255}}, image.Point{}, draw.Src)
	draw.Draw(img, image.Rect(w/4, h/4, w/2, h/2), &image.Uniform{color.RGBA{200, 80, 10, 255}}, image.Point{}, draw.Src)
	return img
}

func BenchmarkRenderLargePNG(b *testing.B) {
	var buf bytes.Buffer
	_ = png.Encode(&buf, bigImage(2800, 2400))
	for i := 0; i < b.N; i++ {
		if _, err := Render(context.Background(), buf.Bytes(), []string{"thumbnail", "crop", "optimized"}, DefaultLimits, time.Minute); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkRenderLargeJPEG(b *testing.B) {
	var buf bytes.Buffer
	_ = jpeg.Encode(&buf, bigImage(2800, 2400), nil)
	for i := 0; i < b.N; i++ {
		if _, err := Render(context.Background(), buf.Bytes(), []string{"thumbnail", "crop", "optimized"}, DefaultLimits, time.Minute); err != nil {
			b.Fatal(err)
		}
	}
}
