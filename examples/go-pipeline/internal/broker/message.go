package broker

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"example.com/gopipe/internal/ids"
)

// Job is the message body (schemas/jobs.schema.json, schema_version 1). It
// carries identifiers and service data only: never a URL, an object key, a
// path or the client's file name.
type Job struct {
	SchemaVersion   int      `json:"schema_version"`
	JobID           string   `json:"job_id"`
	Attempt         int      `json:"attempt"`
	AttachmentID    string   `json:"attachment_id"`
	PipelineVersion int      `json:"pipeline_version"`
	Variants        []string `json:"variants"`
	CreatedAt       string   `json:"created_at"`
	ExpiresAt       string   `json:"expires_at"`
}

// MessageType is the AMQP type property of every job message.
const MessageType = "gopipe.render.v1"

var knownVariants = []string{"thumbnail", "crop", "optimized"}

// Timestamp renders t the way the schema wants: RFC 3339, UTC, at most microseconds.
func Timestamp(t time.Time) string {
	return t.UTC().Truncate(time.Microsecond).Format("2006-01-02T15:04:05.999999Z07:00")
}

// Encode validates and marshals the body.
func (j Job) Encode() ([]byte, error) {
	if err := j.Validate(); err != nil {
		return nil, err
	}
	return json.Marshal(j)
}

// Decode parses and validates a body. Unknown fields are allowed (the
// contract is extended additively) but every required field must be right.
func Decode(body []byte) (Job, error) {
	var j Job
	if err := json.Unmarshal(body, &j); err != nil {
		return j, fmt.Errorf("body is not a JSON job: %w", err)
	}
	return j, j.Validate()
}

// Validate checks the fields the schema requires.
func (j Job) Validate() error {
	var errs []error
	if j.SchemaVersion != 1 {
		errs = append(errs, fmt.Errorf("schema_version %d is not 1", j.SchemaVersion))
	}
	if !ids.Valid(j.JobID) {
		errs = append(errs, errors.New("job_id is not a UUID"))
	}
	if !ids.Valid(j.AttachmentID) {
		errs = append(errs, errors.New("attachment_id is not a UUID"))
	}
	if j.Attempt < 1 || j.Attempt > 1000 {
		errs = append(errs, fmt.Errorf("attempt %d out of range", j.Attempt))
	}
	if j.PipelineVersion < 1 || j.PipelineVersion > 1000 {
		errs = append(errs, fmt.Errorf("pipeline_version %d out of range", j.PipelineVersion))
	}
	if len(j.Variants) == 0 {
		errs = append(errs, errors.New("variants is empty"))
	}
	seen := map[string]bool{}
	for _, v := range j.Variants {
		if !slices.Contains(knownVariants, v) || seen[v] {
			errs = append(errs, fmt.Errorf("variant %q unknown or repeated", v))
		}
		seen[v] = true
	}
	for name, ts := range map[string]string{"created_at": j.CreatedAt, "expires_at": j.ExpiresAt} {
		if _, err := time.Parse(time.RFC3339Nano, ts); err != nil {
			errs = append(errs, fmt.Errorf("%s is not RFC 3339", name))
		}
	}
	return errors.Join(errs...)
}
