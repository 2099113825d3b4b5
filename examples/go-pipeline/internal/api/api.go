// Package api is the HTTP side: uploads, status, events, operator replay,
// health and metrics. An upload is accepted (202) only after the verified
// original is staged in S3 and attachment, job, outbox row and first
// transition are committed in one transaction.
package api

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"example.com/gopipe/internal/config"
	"example.com/gopipe/internal/failpoint"
	"example.com/gopipe/internal/ids"
	"example.com/gopipe/internal/imaging"
	"example.com/gopipe/internal/metrics"
	"example.com/gopipe/internal/storage"
	"example.com/gopipe/internal/store"
)

// Server serves the API.
type Server struct {
	Config     config.Config
	Store      *store.Store
	Objects    *storage.Store
	Failpoints *failpoint.Set
	Metrics    *metrics.Registry
	Actor      string // recorded on the null -> queued transition

	uploads func(outcome string) metrics.Counter
}

// Handler wires the routes.
func (s *Server) Handler() http.Handler {
	s.uploads = func(outcome string) metrics.Counter {
		return s.Metrics.Counter("gopipe_uploads_total", "Upload requests by outcome.", "outcome", outcome)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/attachments", s.upload)
	mux.HandleFunc("GET /v1/attachments/{id}", s.status)
	mux.HandleFunc("GET /v1/attachments/{id}/events", s.events)
	mux.HandleFunc("POST /v1/admin/attachments/{id}/replay", s.replay)
	mux.HandleFunc("GET /healthz", s.health)
	mux.Handle("GET /metrics", s.Metrics.Handler())
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusNotFound, "not_found", "no such route")
	})
	return mux
}

// ---- responses -------------------------------------------------------------

type errorBody struct {
	Error struct {
		Code    string `json:"code"`
		Message string `json:"message"`
	} `json:"error"`
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func writeError(w http.ResponseWriter, status int, code, message string) {
	var b errorBody
	b.Error.Code, b.Error.Message = code, message
	writeJSON(w, status, b)
}

// dbFailure answers 503 when the database cannot be reached (the client
// retries), 500 for anything else.
func dbFailure(w http.ResponseWriter, err error) {
	if !store.IsUnavailable(err) {
		slog.Error("database error", "err", err)
		writeError(w, http.StatusInternalServerError, "internal", "internal error")
		return
	}
	slog.Warn("database unavailable", "err", err)
	writeError(w, http.StatusServiceUnavailable, "database_unavailable", "the database is unavailable; retry later")
}

// storageFailure answers 503: the object store could not be reached.
func storageFailure(w http.ResponseWriter, err error) {
	slog.Warn("object store unavailable", "err", err)
	writeError(w, http.StatusServiceUnavailable, "storage_unavailable", "the object store is unavailable; retry later")
}

func rfc3339(t time.Time) string { return t.UTC().Format(time.RFC3339Nano) }

// ---- status and events -----------------------------------------------------

type objectJSON struct {
	Key         string `json:"key"`
	SHA256      string `json:"sha256"`
	Size        int64  `json:"size"`
	ContentType string `json:"content_type"`
}

type variantJSON struct {
	Name string `json:"name"`
	objectJSON
	Width  int `json:"width"`
	Height int `json:"height"`
}

type statusJSON struct {
	AttachmentID    string        `json:"attachment_id"`
	JobID           string        `json:"job_id"`
	State           string        `json:"state"`
	PipelineVersion int           `json:"pipeline_version"`
	Attempt         int           `json:"attempt"`
	ErrorCode       *string       `json:"error_code"`
	Filename        *string       `json:"filename"`
	Original        objectJSON    `json:"original"`
	Variants        []variantJSON `json:"variants"`
	CreatedAt       string        `json:"created_at"`
	UpdatedAt       string        `json:"updated_at"`
}

// lookup reads one attachment's record by the {id} of the path: 404 for a malformed or unknown id, 503 when the
// database cannot answer; ok is false once the response has been written.
func lookup[T any](s *Server, w http.ResponseWriter, r *http.Request,
	read func(context.Context, string) (T, error)) (record T, ok bool) {
	id := r.PathValue("id")
	if !ids.Valid(id) {
		writeError(w, http.StatusNotFound, "not_found", "no such attachment")
		return record, false
	}
	ctx, cancel := context.WithTimeout(r.Context(), s.Config.IOTimeout)
	defer cancel()
	record, err := read(ctx, id)
	if errors.Is(err, store.ErrNotFound) {
		writeError(w, http.StatusNotFound, "not_found", "no such attachment")
		return record, false
	}
	if err != nil {
		dbFailure(w, err)
		return record, false
	}
	return record, true
}

func (s *Server) status(w http.ResponseWriter, r *http.Request) {
	st, ok := lookup(s, w, r, s.Store.AttachmentStatus)
	if !ok {
		return
	}
	out := statusJSON{
		AttachmentID: st.AttachmentID, JobID: st.JobID, State: st.State, PipelineVersion: st.PipelineVersion,
		Attempt: st.Attempt, ErrorCode: st.ErrorCode, Filename: st.DisplayName,
		Original:  objectJSON{Key: st.OriginalKey, SHA256: st.SHA256, Size: st.Size, ContentType: st.ContentType},
		Variants:  make([]variantJSON, 0, len(st.Variants)),
		CreatedAt: rfc3339(st.CreatedAt), UpdatedAt: rfc3339(st.UpdatedAt),
	}
	for _, v := range st.Variants {
		out.Variants = append(out.Variants, variantJSON{Name: v.Name, Width: v.Width, Height: v.Height,
			objectJSON: objectJSON{Key: v.Key, SHA256: v.SHA256, Size: v.Size, ContentType: v.ContentType}})
	}
	writeJSON(w, http.StatusOK, out)
}

type eventJSON struct {
	Seq           int64   `json:"seq"`
	At            string  `json:"at"`
	From          *string `json:"from"`
	To            string  `json:"to"`
	Attempt       int     `json:"attempt"`
	Reason        *string `json:"reason"`
	Actor         string  `json:"actor"`
	NextAttemptAt *string `json:"next_attempt_at"`
}

func (s *Server) events(w http.ResponseWriter, r *http.Request) {
	list, ok := lookup(s, w, r, s.Store.Transitions)
	if !ok {
		return
	}
	out := struct {
		Events []eventJSON `json:"events"`
	}{Events: make([]eventJSON, 0, len(list))}
	for _, t := range list {
		e := eventJSON{Seq: t.Seq, At: rfc3339(t.At), From: t.From, To: t.To, Attempt: t.Attempt, Reason: t.Reason, Actor: t.Actor}
		if t.NextAttemptAt != nil {
			next := rfc3339(*t.NextAttemptAt)
			e.NextAttemptAt = &next
		}
		out.Events = append(out.Events, e)
	}
	writeJSON(w, http.StatusOK, out)
}

// ---- replay ------------------------------------------------------------------

func (s *Server) replay(w http.ResponseWriter, r *http.Request) {
	auth := strings.TrimSpace(r.Header.Get("Authorization"))
	if auth == "" {
		writeError(w, http.StatusUnauthorized, "unauthenticated", "operator token required (Authorization: Bearer …)")
		return
	}
	token, ok := strings.CutPrefix(auth, "Bearer ")
	if !ok || s.Config.OperatorToken == "" ||
		subtle.ConstantTimeCompare([]byte(strings.TrimSpace(token)), []byte(s.Config.OperatorToken)) != 1 {
		writeError(w, http.StatusForbidden, "forbidden", "not an operator token")
		return
	}
	id := r.PathValue("id")
	if !ids.Valid(id) {
		writeError(w, http.StatusNotFound, "not_found", "no such attachment")
		return
	}
	var body struct {
		Reason string `json:"reason"`
	}
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 16<<10)).Decode(&body); err != nil {
		writeError(w, http.StatusBadRequest, "bad_request", "body must be JSON {\"reason\": \"…\"}")
		return
	}
	reason := cleanText(body.Reason, 200)
	if reason == "" {
		writeError(w, http.StatusUnprocessableEntity, "reason_required", "a non-empty reason is required")
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), s.Config.IOTimeout)
	defer cancel()
	res, err := s.Store.Replay(ctx, id, operatorActor(s.Config.OperatorToken), reason, s.Config.JobTTL)
	var stateErr *store.StateError
	switch {
	case errors.Is(err, store.ErrNotFound):
		writeError(w, http.StatusNotFound, "not_found", "no such attachment")
	case errors.As(err, &stateErr):
		writeError(w, http.StatusConflict, "not_failed", "only a failed attachment can be replayed; it is "+stateErr.State)
	case err != nil:
		dbFailure(w, err)
	default:
		slog.Info("operator replay", "attachment_id", id, "job_id", res.JobID, "attempt", res.NextAttempt)
		writeJSON(w, http.StatusAccepted, map[string]any{"attachment_id": id, "job_id": res.JobID, "attempt": res.NextAttempt})
	}
}

// operatorActor names the operator by a short hash of the token: audit
// records say which credential acted without storing it.
func operatorActor(token string) string {
	sum := sha256.Sum256([]byte(token))
	return "ops:" + hex.EncodeToString(sum[:4])
}

// ---- health --------------------------------------------------------------------

func (s *Server) health(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), time.Second)
	defer cancel()
	db, objects := make(chan error, 1), make(chan error, 1)
	go func() { db <- s.Store.Ping(ctx) }()
	go func() { objects <- s.Objects.Ping(ctx) }()
	word := func(err error) string {
		if err != nil {
			return "unavailable"
		}
		return "ok"
	}
	// Liveness: 200 while the process serves; the dependencies are reported, not required.
	writeJSON(w, http.StatusOK, map[string]string{"status": "ok", "role": "api", "database": word(<-db), "storage": word(<-objects)})
}

// cleanText keeps printable characters only, trimmed to n runes.
func cleanText(s string, n int) string {
	var b strings.Builder
	count := 0
	for _, r := range strings.TrimSpace(s) {
		if r < 0x20 || r == 0x7f {
			continue
		}
		if count == n {
			break
		}
		b.WriteRune(r)
		count++
	}
	return b.String()
}

// imagingLimits are the caps an upload's header is checked against.
var imagingLimits = imaging.DefaultLimits
