package broker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// Session is one connection and one channel that reopen on demand: after the
// broker restarts, the network is cut or a channel error closes the channel,
// the next Channel call dials again and re-declares the topology.
type Session struct {
	URL      string // one broker, or a cluster's nodes comma-separated (AMQP_URLS)
	Name     string // connection name shown in the management UI
	Confirm  bool   // publisher confirms on the channel
	Prefetch int    // basic.qos for consumers (0: none set)

	mu   sync.Mutex
	conn *amqp.Connection
	ch   *amqp.Channel
	next int // the node dialled first: the last one reached, the next one once its connection was lost
}

const (
	dialTimeout  = 5 * time.Second
	heartbeat    = 5 * time.Second
	setupTimeout = 10 * time.Second
)

// Channel returns the open channel, (re)connecting if needed.
func (s *Session) Channel(ctx context.Context) (*amqp.Channel, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ch != nil && !s.ch.IsClosed() && s.conn != nil && !s.conn.IsClosed() {
		return s.ch, nil
	}
	urls := strings.Split(s.URL, ",")
	if s.conn != nil && len(urls) > 1 { // the connection was lost: start with the next node
		s.next = (s.next + 1) % len(urls)
	}
	s.closeLocked()
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	props := amqp.NewConnectionProperties()
	props.SetClientConnectionName(s.Name)
	var conn *amqp.Connection
	var err error
	for step := range urls {
		index := (s.next + step) % len(urls)
		conn, err = amqp.DialConfig(strings.TrimSpace(urls[index]), amqp.Config{
			Heartbeat:  heartbeat,
			Dial:       amqp.DefaultDial(dialTimeout),
			Properties: props,
		})
		if err == nil {
			s.next = index
			break
		}
	}
	if err != nil {
		return nil, fmt.Errorf("amqp dial: %w", err)
	}
	// Channel setup calls take no context; a broker that accepts the
	// connection but does not answer (still recovering its queues after a
	// restart, say) must not hang us: past the deadline the socket is closed,
	// which fails the pending call.
	stuck := time.AfterFunc(setupTimeout, func() { _ = conn.CloseDeadline(time.Now()) })
	ch, err := s.setup(conn)
	if !stuck.Stop() && err == nil {
		err = errors.New("channel setup timed out")
	}
	if err != nil {
		closeAside(conn)
		return nil, err
	}
	slog.Info("broker connected", "connection", s.Name)
	s.conn, s.ch = conn, ch
	return ch, nil
}

func (s *Session) setup(conn *amqp.Connection) (*amqp.Channel, error) {
	ch, err := conn.Channel()
	if err != nil {
		return nil, fmt.Errorf("amqp channel: %w", err)
	}
	if err := Declare(ch); err != nil {
		return nil, err
	}
	if s.Confirm {
		if err := ch.Confirm(false); err != nil {
			return nil, fmt.Errorf("confirm mode: %w", err)
		}
	}
	if s.Prefetch > 0 {
		if err := ch.Qos(s.Prefetch, 0, false); err != nil {
			return nil, fmt.Errorf("qos: %w", err)
		}
	}
	return ch, nil
}

// Bounded runs a broker call that takes no context (basic.consume, say): if
// it has not returned after d, the connection is dropped, which fails it.
func (s *Session) Bounded(d time.Duration, call func() error) error {
	s.mu.Lock()
	conn := s.conn
	s.mu.Unlock()
	if conn == nil {
		return call()
	}
	t := time.AfterFunc(d, func() { _ = conn.CloseDeadline(time.Now()) })
	err := call()
	if !t.Stop() && err == nil {
		err = fmt.Errorf("broker call took longer than %s", d)
	}
	return err
}

// closeAside closes a connection without waiting long for the broker's
// close-ok: on a cut link that would hang.
func closeAside(conn *amqp.Connection) {
	go func() { _ = conn.CloseDeadline(time.Now().Add(time.Second)) }()
}

// Reset drops the connection after an error; the next Channel call reconnects.
func (s *Session) Reset() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closeLocked()
}

// Close ends the session.
func (s *Session) Close() { s.Reset() }

func (s *Session) closeLocked() {
	if s.conn != nil {
		closeAside(s.conn)
	}
	s.conn, s.ch = nil, nil
}

// Retry calls Channel until it succeeds or ctx ends, backing off between tries.
func (s *Session) Retry(ctx context.Context) (*amqp.Channel, error) {
	wait := 200 * time.Millisecond
	for {
		ch, err := s.Channel(ctx)
		if err == nil {
			return ch, nil
		}
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		slog.Warn("broker unavailable, retrying", "connection", s.Name, "err", err, "in", wait)
		select {
		case <-time.After(wait):
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		wait = min(2*wait, 5*time.Second)
	}
}

// DeclareOnce connects, declares the topology and disconnects (used by roles
// that only need the topology to exist, such as the sweeper at start).
func DeclareOnce(ctx context.Context, url, name string) error {
	s := &Session{URL: url, Name: name}
	defer s.Close()
	_, err := s.Channel(ctx)
	return err
}

// ReadyMessages is how many messages wait in the work queue, undelivered
// (a passive declare: it creates nothing). The sweeper asks before giving a
// queued job a new message, since one still waiting there is not lost.
func (s *Session) ReadyMessages(ctx context.Context) (int, error) {
	ch, err := s.Channel(ctx)
	if err != nil {
		return 0, err
	}
	var q amqp.Queue
	err = s.Bounded(setupTimeout, func() error {
		var e error
		q, e = ch.QueueDeclarePassive(WorkQueue, true, false, false, false, nil)
		return e
	})
	if err != nil {
		s.Reset() // a failed passive declare closes the channel; the next call reopens it
		return 0, err
	}
	return q.Messages, nil
}
