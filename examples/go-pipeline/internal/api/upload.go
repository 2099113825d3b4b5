package api

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"log/slog"
	"mime/multipart"
	"net/http"
	"path"
	"strings"
	"time"

	"example.com/gopipe/internal/failpoint"
	"example.com/gopipe/internal/ids"
	"example.com/gopipe/internal/imaging"
	"example.com/gopipe/internal/storage"
	"example.com/gopipe/internal/store"
)

type accepted struct {
	AttachmentID string `json:"attachment_id"`
	JobID        string `json:"job_id"`
	StatusURL    string `json:"status_url"`
}

func acceptedBody(attachmentID, jobID string) accepted {
	return accepted{AttachmentID: attachmentID, JobID: jobID, StatusURL: "/v1/attachments/" + attachmentID}
}

// errTooLarge marks an upload over the cap, noticed while streaming.
var errTooLarge = errors.New("upload too large")

// file is the verified upload, held in memory (bounded by the cap).
type file struct {
	data        []byte
	sha256      string
	contentType string
	name        string
}

func (s *Server) upload(w http.ResponseWriter, r *http.Request) {
	key := strings.TrimSpace(r.Header.Get("Idempotency-Key"))
	if len(key) > 255 {
		s.reject(w, http.StatusBadRequest, "bad_idempotency_key", "Idempotency-Key is longer than 255 characters")
		return
	}
	f, status, code, msg := s.readFile(w, r)
	if status != 0 {
		s.reject(w, status, code, msg)
		return
	}
	ctx := r.Context()
	if key != "" {
		switch found, err := s.answerRepeatedKey(ctx, w, key, f); {
		case err != nil:
			s.uploads("unavailable").Inc()
			dbFailure(w, err)
			return
		case found:
			return
		}
	}

	// 1. Stage the verified original under a key of our own making.
	stagingKey := storage.StagingKey(time.Now(), ids.New())
	if err := s.Objects.Put(ctx, stagingKey, f.data, f.contentType); err != nil {
		s.uploads("unavailable").Inc()
		storageFailure(w, err)
		return
	}
	stagedAt := time.Now()
	if err := s.Failpoints.Hit(ctx, failpoint.AfterStagingBeforeRecord); err != nil {
		s.uploads("unavailable").Inc()
		dbFailure(w, err)
		return
	}

	// 2. One transaction: attachment + job + outbox row + first transition.
	// It must land well inside the staging retention, or the sweeper could
	// remove the original of a record committed late; past that, the client
	// gets a 503 and retries with a fresh staging object.
	ctx, cancel := context.WithDeadline(ctx, stagedAt.Add(min(s.Config.IOTimeout, s.Config.StagingRetention/2)))
	defer cancel()
	u := store.NewUpload{
		AttachmentID: ids.New(), JobID: ids.New(), SHA256: f.sha256, OriginalKey: stagingKey,
		Size: int64(len(f.data)), ContentType: f.contentType, DisplayName: f.name,
		PipelineVersion: s.Config.PipelineVersion, Variants: s.Config.Variants(), MaxAttempts: s.Config.MaxAttempts,
		TTL: s.Config.JobTTL, Actor: s.Actor,
	}
	if key != "" {
		u.IdempotencyKey = &key
	}
	err := s.Store.CreateUpload(ctx, u)
	if errors.Is(err, store.ErrConflict) && key != "" {
		// A concurrent request with the same key committed first; our staged
		// copy is an orphan that retention removes.
		if found, err := s.answerRepeatedKey(ctx, w, key, f); found || err != nil {
			if err != nil {
				dbFailure(w, err)
			}
			return
		}
	}
	if err != nil {
		s.uploads("unavailable").Inc()
		dbFailure(w, err)
		return
	}
	s.uploads("accepted").Inc()
	slog.Info("upload accepted", "attachment_id", u.AttachmentID, "job_id", u.JobID, "size", len(f.data), "type", f.contentType)
	writeJSON(w, http.StatusAccepted, acceptedBody(u.AttachmentID, u.JobID))
}

// answerRepeatedKey answers a repeated Idempotency-Key: the same ids for the
// same bytes, 409 for other bytes. found is false when the key is new.
func (s *Server) answerRepeatedKey(ctx context.Context, w http.ResponseWriter, key string, f *file) (bool, error) {
	ctx, cancel := context.WithTimeout(ctx, s.Config.IOTimeout)
	defer cancel()
	prior, err := s.Store.ByIdempotencyKey(ctx, key)
	if errors.Is(err, store.ErrNotFound) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	if prior.SHA256 != f.sha256 {
		s.reject(w, http.StatusConflict, "idempotency_key_reused", "this Idempotency-Key was used for different content")
		return true, nil
	}
	s.uploads("repeated").Inc()
	writeJSON(w, http.StatusAccepted, acceptedBody(prior.AttachmentID, prior.JobID))
	return true, nil
}

func (s *Server) reject(w http.ResponseWriter, status int, code, msg string) {
	s.uploads("rejected").Inc()
	writeError(w, status, code, msg)
}

// readFile streams the multipart body, counting the file's bytes against the
// cap as they arrive (413 as soon as it is passed), sniffing the type from its
// magic bytes (415) and checking the image header (422). It returns a zero
// status on success.
func (s *Server) readFile(w http.ResponseWriter, r *http.Request) (*file, int, string, string) {
	limit := s.Config.MaxUploadBytes
	r.Body = http.MaxBytesReader(w, r.Body, limit+64<<10) // the file plus multipart framing
	mr, err := r.MultipartReader()
	if err != nil {
		return nil, http.StatusBadRequest, "bad_request", "expected a multipart/form-data body with a file field"
	}
	for {
		part, err := mr.NextPart()
		if errors.Is(err, io.EOF) {
			return nil, http.StatusUnprocessableEntity, "file_required", "the multipart field 'file' is missing"
		}
		if err != nil {
			return nil, tooLargeOr(err, http.StatusBadRequest), "bad_request", "malformed multipart body"
		}
		if part.FormName() != "file" {
			if _, err := io.Copy(io.Discard, part); err != nil {
				return nil, tooLargeOr(err, http.StatusBadRequest), "bad_request", "malformed multipart body"
			}
			continue
		}
		return s.readPart(part, limit)
	}
}

func (s *Server) readPart(part *multipart.Part, limit int64) (*file, int, string, string) {
	var buf bytes.Buffer
	hash := sha256.New()
	n, err := io.Copy(io.MultiWriter(&buf, hash), io.LimitReader(part, limit+1))
	if err != nil {
		return nil, tooLargeOr(err, http.StatusBadRequest), "bad_request", "upload interrupted"
	}
	if n > limit {
		return nil, http.StatusRequestEntityTooLarge, "too_large", "the file exceeds the upload limit"
	}
	data := buf.Bytes()
	if len(data) == 0 {
		return nil, http.StatusUnsupportedMediaType, "empty_file", "the file is empty"
	}
	contentType := imaging.Sniff(data[:min(len(data), imaging.SniffLen)])
	if contentType == "" {
		return nil, http.StatusUnsupportedMediaType, "unsupported_type", "only JPEG, PNG, GIF and WebP images are accepted"
	}
	if _, _, err := imaging.Check(data, imagingLimits); err != nil {
		var perr *imaging.Error
		if errors.As(err, &perr) {
			return nil, http.StatusUnprocessableEntity, strings.ReplaceAll(perr.Code, "-", "_"), perr.Error()
		}
		return nil, http.StatusUnprocessableEntity, "unreadable_image", "the image header cannot be read"
	}
	return &file{data: data, sha256: hex.EncodeToString(hash.Sum(nil)), contentType: contentType,
		name: displayName(part.FileName())}, 0, "", ""
}

func tooLargeOr(err error, fallback int) int {
	var mbe *http.MaxBytesError
	if errors.As(err, &mbe) {
		return http.StatusRequestEntityTooLarge
	}
	return fallback
}

// displayName keeps the client's file name for display only: its base name,
// printable, at most 200 characters. It never reaches a key or a message.
func displayName(name string) string {
	name = strings.ReplaceAll(name, `\`, "/")
	name = path.Base(name)
	if name == "." || name == "/" {
		return ""
	}
	return cleanText(name, 200)
}
