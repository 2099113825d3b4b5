package api

import (
	"bytes"
	"encoding/json"
	"mime/multipart"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"example.com/gopipe/internal/config"
	"example.com/gopipe/internal/metrics"
)

// These requests are all refused before any dependency is touched, so the
// server needs no database or object store.
func testServer() http.Handler {
	s := &Server{Config: config.Config{MaxUploadBytes: 1024, OperatorToken: "sesame"}, Metrics: metrics.New()}
	return s.Handler()
}

func multipartBody(t *testing.T, field string, data []byte) (*bytes.Buffer, string) {
	var buf bytes.Buffer
	mw := multipart.NewWriter(&buf)
	part, err := mw.CreateFormFile(field, "../../etc/holiday photo.png")
	if err != nil {
		t.Fatal(err)
	}
	part.Write(data)
	mw.Close()
	return &buf, mw.FormDataContentType()
}

func post(t *testing.T, h http.Handler, field string, data []byte) (int, string) {
	body, ctype := multipartBody(t, field, data)
	req := httptest.NewRequest(http.MethodPost, "/v1/attachments", body)
	req.Header.Set("Content-Type", ctype)
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	var e errorBody
	_ = json.Unmarshal(rec.Body.Bytes(), &e)
	return rec.Code, e.Error.Code
}

func TestUploadRefusals(t *testing.T) {
	h := testServer()
	png := []byte("\x89PNG\r\n\x1a\n")
	cases := []struct {
		name   string
		field  string
		data   []byte
		status int
	}{
		{"over the cap while streaming", "file", append(png, bytes.Repeat([]byte{0}, 2048)...), http.StatusRequestEntityTooLarge},
		{"not an image", "file", []byte("<html><body>hello</body></html>"), http.StatusUnsupportedMediaType},
		{"empty", "file", nil, http.StatusUnsupportedMediaType},
		{"magic bytes but no header", "file", png, http.StatusUnprocessableEntity},
		{"no file field", "document", png, http.StatusUnprocessableEntity},
	}
	for _, c := range cases {
		status, code := post(t, h, c.field, c.data)
		if status != c.status || code == "" {
			t.Errorf("%s: got %d %q, want %d with an error code", c.name, status, code, c.status)
		}
	}
	req := httptest.NewRequest(http.MethodPost, "/v1/attachments", strings.NewReader("x"))
	req.Header.Set("Content-Type", "text/plain")
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	if rec.Code != http.StatusBadRequest {
		t.Errorf("non-multipart body: %d", rec.Code)
	}
}

func TestReplayNeedsTheOperatorToken(t *testing.T) {
	h := testServer()
	path := "/v1/admin/attachments/5f1d2c3b-8a9e-4b7c-9d0e-1f2a3b4c5d6e/replay"
	for auth, want := range map[string]int{
		"":              http.StatusUnauthorized,
		"Bearer wrong":  http.StatusForbidden,
		"Basic sesame":  http.StatusForbidden,
		"Bearer sesame": http.StatusBadRequest, // authorised; the empty body is refused next
	} {
		req := httptest.NewRequest(http.MethodPost, path, strings.NewReader(""))
		if auth != "" {
			req.Header.Set("Authorization", auth)
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if rec.Code != want {
			t.Errorf("Authorization %q: got %d, want %d", auth, rec.Code, want)
		}
	}
}

func TestDisplayName(t *testing.T) {
	for in, want := range map[string]string{
		"../../etc/holiday photo.png": "holiday photo.png",
		`C:\Users\x\scan.jpg`:         "scan.jpg",
		"a\x00b\nc.gif":               "abc.gif",
		"":                            "",
	} {
		if got := displayName(in); got != want {
			t.Errorf("displayName(%q) = %q, want %q", in, got, want)
		}
	}
	if operatorActor("sesame") == operatorActor("other") || !strings.HasPrefix(operatorActor("sesame"), "ops:") {
		t.Error("operator actors must differ per token and start with ops:")
	}
}
