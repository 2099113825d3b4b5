// Package storage is the S3 side: originals staged under a server-generated
// key, variants under deterministic keys, every call bounded by a timeout.
package storage

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"
)

// StagingPrefix is the folder of every original. Objects in it that no
// committed attachment refers to are orphans of uploads that got no 202; the
// sweeper removes them after the staging retention.
const StagingPrefix = "staging/"

// stampLayout starts every staging key, so that keys sort by staging time and
// the sweeper lists only the window it has not looked at yet.
const stampLayout = "20060102T150405Z"

// StagingKey is a fresh server-generated key for an upload's original:
// staging/<UTC time>-<random id>. It never contains anything the client sent.
func StagingKey(at time.Time, uploadID string) string {
	return StagingPrefix + at.UTC().Format(stampLayout) + "-" + uploadID
}

// StagedAt reads the time back from a staging key.
func StagedAt(key string) (time.Time, bool) {
	rest, ok := strings.CutPrefix(key, StagingPrefix)
	if !ok || len(rest) < len(stampLayout) {
		return time.Time{}, false
	}
	t, err := time.Parse(stampLayout, rest[:len(stampLayout)])
	return t, err == nil
}

// VariantKey is the deterministic key of an effect (attachment, pipeline
// version, variant): every attempt writes the same key, so a redelivery
// rewrites the same object instead of adding one.
func VariantKey(attachmentID string, pipelineVersion int, variant, ext string) string {
	return fmt.Sprintf("variants/%s/v%d/%s.%s", attachmentID, pipelineVersion, variant, ext)
}

// Store talks to one bucket.
type Store struct {
	client  *minio.Client
	bucket  string
	timeout time.Duration
}

// ErrNotFound is returned for a missing object.
var ErrNotFound = errors.New("object not found")

// New builds a path-style client (SeaweedFS, MinIO and Toxiproxy in front of them).
func New(endpoint, bucket, accessKey, secretKey string, timeout time.Duration) (*Store, error) {
	u, err := url.Parse(endpoint)
	if err != nil || u.Host == "" {
		return nil, fmt.Errorf("S3_ENDPOINT_URL %q: not a URL", endpoint)
	}
	transport := &http.Transport{
		Proxy:                 nil,
		DialContext:           (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConnsPerHost:   16,
		IdleConnTimeout:       30 * time.Second,
		ResponseHeaderTimeout: timeout,
		ExpectContinueTimeout: time.Second,
	}
	client, err := minio.New(u.Host, &minio.Options{
		Creds:        credentials.NewStaticV4(accessKey, secretKey, ""),
		Secure:       u.Scheme == "https",
		Region:       "us-east-1",
		BucketLookup: minio.BucketLookupPath,
		Transport:    transport,
		MaxRetries:   1, // retries belong to the pipeline (backoff, attempts), not to the client
	})
	if err != nil {
		return nil, err
	}
	return &Store{client: client, bucket: bucket, timeout: timeout}, nil
}

// Put writes an object whole.
func (s *Store) Put(ctx context.Context, key string, data []byte, contentType string) error {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	_, err := s.client.PutObject(ctx, s.bucket, key, bytes.NewReader(data), int64(len(data)), minio.PutObjectOptions{
		ContentType:          contentType,
		DisableMultipart:     true,
		DisableContentSha256: true,
	})
	return err
}

// Get reads an object whole, refusing anything larger than limit bytes.
func (s *Store) Get(ctx context.Context, key string, limit int64) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	obj, err := s.client.GetObject(ctx, s.bucket, key, minio.GetObjectOptions{})
	if err != nil {
		return nil, err
	}
	defer obj.Close()
	data, err := io.ReadAll(io.LimitReader(obj, limit+1))
	if err != nil {
		if minio.ToErrorResponse(err).Code == "NoSuchKey" {
			return nil, ErrNotFound
		}
		return nil, err
	}
	if int64(len(data)) > limit {
		return nil, fmt.Errorf("object %s larger than %d bytes", key, limit)
	}
	return data, nil
}

// Object is one listing entry.
type Object struct {
	Key          string
	LastModified time.Time
}

// ListStaged returns staged objects whose key time is in [from, to) and that
// were last modified before to, in key order, at most max. A zero from lists
// from the beginning.
func (s *Store) ListStaged(ctx context.Context, from, to time.Time, max int) ([]Object, error) {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	opts := minio.ListObjectsOptions{Prefix: StagingPrefix, Recursive: true}
	if !from.IsZero() {
		opts.StartAfter = StagingPrefix + from.UTC().Format(stampLayout)
	}
	var out []Object
	for info := range s.client.ListObjects(ctx, s.bucket, opts) {
		if info.Err != nil {
			return out, info.Err
		}
		at, ok := StagedAt(info.Key)
		if ok && !at.Before(to) {
			break // keys sort by time: the rest is younger
		}
		if ok && !at.Before(from) && info.LastModified.Before(to) {
			out = append(out, Object{Key: info.Key, LastModified: info.LastModified})
			if len(out) >= max {
				break
			}
		}
	}
	return out, nil
}

// Delete removes an object (missing objects are not an error).
func (s *Store) Delete(ctx context.Context, key string) error {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	return s.client.RemoveObject(ctx, s.bucket, key, minio.RemoveObjectOptions{})
}

// Ping checks that the bucket answers.
func (s *Store) Ping(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, min(s.timeout, 3*time.Second))
	defer cancel()
	ok, err := s.client.BucketExists(ctx, s.bucket)
	if err == nil && !ok {
		err = fmt.Errorf("bucket %s does not exist", s.bucket)
	}
	return err
}
