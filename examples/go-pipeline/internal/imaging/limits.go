package imaging

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"image"
	// Decoders for image.DecodeConfig / image.Decode.
	_ "image/gif"
	_ "image/jpeg"
	_ "image/png"

	_ "golang.org/x/image/webp"
)

// Limits bound what the decoder may be asked to do.
type Limits struct {
	MaxPixels int // width × height of one frame
	MaxSide   int // longest side
	MaxFrames int // frames of an animation
}

// DefaultLimits: ≈40 MP, 12 000 px per side, 200 frames.
var DefaultLimits = Limits{MaxPixels: 40_000_000, MaxSide: 12_000, MaxFrames: 200}

// Error is a permanent failure of an input: retrying cannot help.
type Error struct {
	Code string // error_code recorded on the job
	Err  error
}

func (e *Error) Error() string { return e.Code + ": " + e.Err.Error() }
func (e *Error) Unwrap() error { return e.Err }

func permanent(code string, err error) *Error { return &Error{Code: code, Err: err} }

// Check reads only the header (and, for GIF, the block structure) and refuses
// images that are too big to decode safely.
func Check(data []byte, l Limits) (image.Config, string, error) {
	cfg, format, err := image.DecodeConfig(bytes.NewReader(data))
	if err != nil {
		return cfg, format, permanent("image-undecodable", err)
	}
	if cfg.Width <= 0 || cfg.Height <= 0 {
		return cfg, format, permanent("image-undecodable", fmt.Errorf("empty image %dx%d", cfg.Width, cfg.Height))
	}
	if cfg.Width > l.MaxSide || cfg.Height > l.MaxSide {
		return cfg, format, permanent("image-too-large", fmt.Errorf("%dx%d exceeds %d px per side", cfg.Width, cfg.Height, l.MaxSide))
	}
	if int64(cfg.Width)*int64(cfg.Height) > int64(l.MaxPixels) {
		return cfg, format, permanent("image-too-large", fmt.Errorf("%dx%d exceeds %d pixels", cfg.Width, cfg.Height, l.MaxPixels))
	}
	if format == "gif" {
		frames, err := gifFrames(data)
		if err != nil {
			return cfg, format, permanent("image-undecodable", err)
		}
		if frames > l.MaxFrames {
			return cfg, format, permanent("too-many-frames", fmt.Errorf("%d frames exceed %d", frames, l.MaxFrames))
		}
	}
	return cfg, format, nil
}

var errTruncated = errors.New("gif: truncated block structure")

// gifFrames counts image descriptors by walking the GIF block structure,
// without decompressing any frame.
func gifFrames(data []byte) (int, error) {
	if len(data) < 13 {
		return 0, errTruncated
	}
	pos := 13
	if packed := data[10]; packed&0x80 != 0 {
		pos += 3 << ((packed & 7) + 1)
	}
	skipSubBlocks := func() error {
		for {
			if pos >= len(data) {
				return errTruncated
			}
			size := int(data[pos])
			pos++
			if size == 0 {
				return nil
			}
			pos += size
		}
	}
	frames := 0
	for pos < len(data) {
		switch data[pos] {
		case 0x3B: // trailer
			return frames, nil
		case 0x21: // extension: label, then sub-blocks
			pos += 2
			if err := skipSubBlocks(); err != nil {
				return frames, err
			}
		case 0x2C: // image descriptor
			if pos+10 > len(data) {
				return frames, errTruncated
			}
			frames++
			packed := data[pos+9]
			pos += 10
			if packed&0x80 != 0 {
				pos += 3 << ((packed & 7) + 1)
			}
			pos++ // LZW minimum code size
			if err := skipSubBlocks(); err != nil {
				return frames, err
			}
		default:
			return frames, fmt.Errorf("gif: unknown block 0x%02x", data[pos])
		}
	}
	return frames, nil // no trailer: let the decoder judge
}

// jpegOrientation returns the EXIF orientation (1–8) of a JPEG, 1 if absent.
func jpegOrientation(data []byte) int {
	if len(data) < 4 || data[0] != 0xFF || data[1] != 0xD8 {
		return 1
	}
	pos := 2
	for pos+4 <= len(data) {
		if data[pos] != 0xFF {
			return 1
		}
		marker := data[pos+1]
		if marker == 0xDA || marker == 0xD9 { // start of scan / end: no APP1 before
			return 1
		}
		size := int(binary.BigEndian.Uint16(data[pos+2:]))
		if size < 2 || pos+2+size > len(data) {
			return 1
		}
		seg := data[pos+4 : pos+2+size]
		if marker == 0xE1 && len(seg) > 14 && string(seg[:6]) == "Exif\x00\x00" {
			return exifOrientation(seg[6:])
		}
		pos += 2 + size
	}
	return 1
}

func exifOrientation(tiff []byte) int {
	if len(tiff) < 8 {
		return 1
	}
	var order binary.ByteOrder
	switch string(tiff[:2]) {
	case "II":
		order = binary.LittleEndian
	case "MM":
		order = binary.BigEndian
	default:
		return 1
	}
	ifd := int(order.Uint32(tiff[4:]))
	if ifd+2 > len(tiff) {
		return 1
	}
	n := int(order.Uint16(tiff[ifd:]))
	for i := 0; i < n; i++ {
		e := ifd + 2 + 12*i
		if e+12 > len(tiff) {
			return 1
		}
		if order.Uint16(tiff[e:]) == 0x0112 { // Orientation, SHORT
			if o := int(order.Uint16(tiff[e+8:])); o >= 1 && o <= 8 {
				return o
			}
			return 1
		}
	}
	return 1
}
