// Package imaging recognises, checks and renders images with Go's own codecs:
// type from magic bytes, dimension caps read from the header before any pixel
// is decoded, a frame cap for GIF, EXIF orientation for JPEG, and three
// deterministic variants re-encoded without metadata.
package imaging

import "bytes"

// SniffLen is how many leading bytes Sniff needs.
const SniffLen = 12

// Sniff names the media type from magic bytes: image/jpeg, image/png,
// image/gif or image/webp; "" for anything else.
func Sniff(head []byte) string {
	switch {
	case len(head) >= 3 && bytes.Equal(head[:3], []byte{0xFF, 0xD8, 0xFF}):
		return "image/jpeg"
	case len(head) >= 8 && bytes.Equal(head[:8], []byte("\x89PNG\r\n\x1a\n")):
		return "image/png"
	case len(head) >= 6 && (bytes.Equal(head[:6], []byte("GIF87a")) || bytes.Equal(head[:6], []byte("GIF89a"))):
		return "image/gif"
	case len(head) >= 12 && bytes.Equal(head[:4], []byte("RIFF")) && bytes.Equal(head[8:12], []byte("WEBP")):
		return "image/webp"
	}
	return ""
}
