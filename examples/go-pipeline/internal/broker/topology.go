// Package broker is the RabbitMQ side: the topology every role declares at
// start (idempotently), the job message, a reconnecting connection, a
// confirming publisher and a bounded consumer.
package broker

import (
	"fmt"

	amqp "github.com/rabbitmq/amqp091-go"
)

// Names of the topology. The exchange is direct: one routing key, one queue.
const (
	Exchange       = "gopipe.work"
	RoutingKey     = "render"
	WorkQueue      = "gopipe.render"
	DeadExchange   = "gopipe.dead"
	DeadQueue      = "gopipe.render.dead"
	deliveryLimit  = 10                   // broker redeliveries (crashed consumers) before dead-lettering
	deadLetterTTLs = 7 * 24 * 3600 * 1000 // DLQ retention: 7 days, in ms
)

// Declare creates (or confirms) the whole topology. RabbitMQ declarations are
// idempotent as long as the arguments agree, so every role runs this at start
// and after every reconnect.
func Declare(ch *amqp.Channel) error {
	if err := ch.ExchangeDeclare(DeadExchange, amqp.ExchangeFanout, true, false, false, false, nil); err != nil {
		return fmt.Errorf("declare exchange %s: %w", DeadExchange, err)
	}
	if _, err := ch.QueueDeclare(DeadQueue, true, false, false, false, amqp.Table{
		"x-queue-type":  "quorum",
		"x-message-ttl": int64(deadLetterTTLs),
	}); err != nil {
		return fmt.Errorf("declare queue %s: %w", DeadQueue, err)
	}
	if err := ch.QueueBind(DeadQueue, "", DeadExchange, false, nil); err != nil {
		return fmt.Errorf("bind %s: %w", DeadQueue, err)
	}
	if err := ch.ExchangeDeclare(Exchange, amqp.ExchangeDirect, true, false, false, false, nil); err != nil {
		return fmt.Errorf("declare exchange %s: %w", Exchange, err)
	}
	if _, err := ch.QueueDeclare(WorkQueue, true, false, false, false, amqp.Table{
		"x-queue-type":           "quorum",
		"x-delivery-limit":       int64(deliveryLimit),
		"x-dead-letter-exchange": DeadExchange,
		// at-least-once dead-lettering needs reject-publish overflow
		"x-dead-letter-strategy": "at-least-once",
		"x-overflow":             "reject-publish",
	}); err != nil {
		return fmt.Errorf("declare queue %s: %w", WorkQueue, err)
	}
	if err := ch.QueueBind(WorkQueue, RoutingKey, Exchange, false, nil); err != nil {
		return fmt.Errorf("bind %s: %w", WorkQueue, err)
	}
	return nil
}
