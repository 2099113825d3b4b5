package broker

import (
	"strings"
	"testing"
	"time"
)

func validJob() Job {
	at := time.Date(2026, 11, 29, 12, 0, 0, 123456789, time.UTC)
	return Job{SchemaVersion: 1, JobID: "0b7e7c52-3f0e-4a52-9a57-6d2b7c1f9e01", Attempt: 1,
		AttachmentID: "5f1d2c3b-8a9e-4b7c-9d0e-1f2a3b4c5d6e", PipelineVersion: 1,
		Variants: []string{"thumbnail", "crop", "optimized"}, CreatedAt: Timestamp(at), ExpiresAt: Timestamp(at.Add(time.Hour))}
}

func TestTimestampFormat(t *testing.T) {
	got := Timestamp(time.Date(2026, 11, 29, 12, 0, 0, 123456789, time.FixedZone("x", 3600)))
	if got != "2026-11-29T11:00:00.123456Z" {
		t.Errorf("Timestamp = %q", got)
	}
	if got := Timestamp(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)); got != "2026-01-02T03:04:05Z" {
		t.Errorf("whole second: %q", got)
	}
}

func TestRoundTrip(t *testing.T) {
	body, err := validJob().Encode()
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(body), "://") {
		t.Error("a body must never carry a URL")
	}
	j, err := Decode(body)
	if err != nil || j.JobID != validJob().JobID {
		t.Fatalf("Decode: %v %+v", err, j)
	}
}

func TestDecodeRejects(t *testing.T) {
	bad := map[string]string{
		"not json":     `{"job_id":`,
		"no job id":    `{"schema_version":1,"attempt":1}`,
		"attempt zero": strings.Replace(mustEncode(t), `"attempt":1`, `"attempt":0`, 1),
		"bad variant":  strings.Replace(mustEncode(t), `"crop"`, `"sepia"`, 1),
		"upper uuid":   strings.Replace(mustEncode(t), "0b7e7c52", "0B7E7C52", 1),
	}
	for name, body := range bad {
		if _, err := Decode([]byte(body)); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	extra := strings.Replace(mustEncode(t), `{`, `{"traceparent":"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",`, 1)
	if _, err := Decode([]byte(extra)); err != nil {
		t.Errorf("additive fields must be accepted: %v", err)
	}
}

func mustEncode(t *testing.T) string {
	body, err := validJob().Encode()
	if err != nil {
		t.Fatal(err)
	}
	return string(body)
}
