// RabbitMQ: a TOPIC exchange, a durable work queue bound to it, a dead-letter exchange and queue.
// Every role that publishes or consumes declares the whole topology when it connects, and so does `migrate`,
// so a publish made while every consumer is held is routed (docs/CONTRACT.md §4).
import amqp, { Channel, ConfirmChannel, Connection } from "amqplib";
import { Config, log } from "./config";

export const EXCHANGE = "tsp.jobs";           // topic
export const ROUTING_KEY = "render.v1";
export const BINDING = "render.*";
export const WORK_QUEUE = "tsp.render";
export const DEAD_EXCHANGE = "tsp.jobs.dead";  // fanout
export const DEAD_QUEUE = "tsp.render.dead";

export async function declareTopology(ch: Channel): Promise<void> {
  await ch.assertExchange(EXCHANGE, "topic", { durable: true });
  await ch.assertExchange(DEAD_EXCHANGE, "fanout", { durable: true });
  await ch.assertQueue(DEAD_QUEUE, { durable: true });
  await ch.bindQueue(DEAD_QUEUE, DEAD_EXCHANGE, "");
  await ch.assertQueue(WORK_QUEUE, { durable: true, arguments: { "x-dead-letter-exchange": DEAD_EXCHANGE } });
  await ch.bindQueue(WORK_QUEUE, EXCHANGE, BINDING);
}

function withHeartbeat(url: string): string {
  if (/[?&]heartbeat=/.test(url)) return url;
  return url + (url.includes("?") ? "&" : "?") + "heartbeat=8";
}

let nextNode = 0;

export async function connect(cfg: Config, name: string): Promise<Connection> {
  let lastErr: unknown;
  for (let i = 0; i < cfg.amqpUrls.length; i++) {
    const idx = (nextNode + i) % cfg.amqpUrls.length;
    try {
      const conn = await amqp.connect(withHeartbeat(cfg.amqpUrls[idx]), {
        timeout: cfg.ioTimeoutMs,
        clientProperties: { connection_name: `${name} ${cfg.identity}` },
      });
      nextNode = idx;
      conn.on("error", (err) => log("amqp connection error", { error: String(err) }));
      conn.on("close", () => {
        nextNode = (idx + 1) % cfg.amqpUrls.length; // on loss, try the next node first
      });
      return conn;
    } catch (err) {
      lastErr = err;
    }
  }
  throw lastErr;
}

// A publisher with confirms, reconnecting lazily. Returned (unroutable) messages count as not published.
export class Publisher {
  private conn?: Connection;
  private ch?: ConfirmChannel;
  private connecting?: Promise<ConfirmChannel>;
  private returned = new Set<string>();

  constructor(private cfg: Config) {}

  private async channel(): Promise<ConfirmChannel> {
    if (this.ch) return this.ch;
    if (!this.connecting) {
      this.connecting = (async () => {
        const conn = await connect(this.cfg, "publisher");
        try {
          const ch = await conn.createConfirmChannel();
          ch.on("error", (err) => log("amqp publish channel error", { error: String(err) }));
          ch.on("close", () => {
            if (this.ch === ch) this.ch = undefined;
            conn.close().catch(() => undefined);
          });
          ch.on("return", (msg) => {
            const id = msg.properties.messageId;
            if (id) this.returned.add(id);
            log("message returned unroutable", { message_id: id });
          });
          await declareTopology(ch);
          this.conn = conn;
          this.ch = ch;
          return ch;
        } catch (err) {
          conn.close().catch(() => undefined);
          throw err;
        }
      })().finally(() => {
        this.connecting = undefined;
      });
    }
    return this.connecting;
  }

  // Publishes and waits for the broker's confirm; `beforeConfirm` runs between the publish and the wait.
  async publish(body: Buffer, messageId: string, beforeConfirm?: () => Promise<void>): Promise<void> {
    const ch = await this.channel();
    const confirmed = new Promise<void>((resolve, reject) => {
      const timer = setTimeout(() => {
        reject(new Error("publish confirm timed out"));
        this.drop();
      }, this.cfg.ioTimeoutMs);
      ch.publish(EXCHANGE, ROUTING_KEY, body, {
        persistent: true,
        mandatory: true,
        contentType: "application/json",
        messageId,
        type: "tsp.render.job",
        appId: "ts-pipeline",
        timestamp: Math.floor(Date.now() / 1000),
      }, (err) => {
        clearTimeout(timer);
        if (err) reject(new Error("publish nacked by the broker"));
        else resolve();
      });
    });
    confirmed.catch(() => undefined);
    if (beforeConfirm) await beforeConfirm();
    await confirmed;
    if (this.returned.delete(messageId)) throw new Error("message returned unroutable: topology missing");
  }

  drop(): void {
    const conn = this.conn;
    this.ch = undefined;
    this.conn = undefined;
    if (conn) conn.close().catch(() => undefined);
  }
}
