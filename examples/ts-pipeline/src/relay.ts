// The outbox relay (runs inside the API process): publishes due outbox rows with publisher confirms and marks
// a row published only after the broker's ack. A returned (unroutable) or unconfirmed message is retried.
import { randomUUID } from "crypto";
import { Pool } from "pg";
import { Config, log } from "./config";
import { tx } from "./db";
import { Publisher } from "./broker";
import * as failpoints from "./failpoints";
import * as messages from "./messages";
import * as metrics from "./metrics";

export class Relay {
  private wake?: () => void;
  private stopped = false;
  private publisher: Publisher;

  constructor(private cfg: Config, private db: Pool) {
    this.publisher = new Publisher(cfg);
  }

  kick(): void {
    if (this.wake) this.wake();
  }

  stop(): void {
    this.stopped = true;
    this.kick();
    this.publisher.drop();
  }

  async run(): Promise<void> {
    while (!this.stopped) {
      let busy = false;
      try {
        busy = await this.tick();
      } catch (err) {
        log("relay tick failed", { error: String(err) });
      }
      if (!busy) {
        await new Promise<void>((resolve) => {
          const timer = setTimeout(resolve, this.cfg.relayPollMs);
          this.wake = () => {
            clearTimeout(timer);
            resolve();
          };
        });
        this.wake = undefined;
      }
    }
  }

  // One batch: lock due rows (so a second relay skips them), publish each, mark it. True when it published any.
  private async tick(): Promise<boolean> {
    const rows = await tx(this.db, async (c) => {
      const r = await c.query(
        `SELECT o.id AS outbox_id, t.id, t.file_id, t.attempt, t.pipeline_version, t.variants, t.created_at,
                t.expires_at, t.status
           FROM outbox o JOIN tasks t ON t.id = o.task_id
          WHERE o.published_at IS NULL AND o.available_at <= now()
            AND (o.locked_until IS NULL OR o.locked_until < now())
          ORDER BY o.available_at, o.id
          LIMIT 20
          FOR UPDATE OF o SKIP LOCKED`,
      );
      if (r.rows.length) {
        await c.query(
          `UPDATE outbox SET locked_until = now() + make_interval(secs => $2::float8 / 1000), tries = tries + 1
            WHERE id = ANY($1::bigint[])`,
          [r.rows.map((x) => x.outbox_id), this.cfg.relayLockMs],
        );
      }
      return r.rows;
    });
    for (const row of rows) {
      if (this.stopped) break;
      if (row.status === "DONE" || row.status === "ERROR") {
        await this.db.query("UPDATE outbox SET published_at = now() WHERE id = $1", [row.outbox_id]);
        continue;
      }
      await failpoints.hit("after_commit_before_publish");
      const body = Buffer.from(JSON.stringify(messages.build(row)));
      try {
        await this.publisher.publish(body, randomUUID(), () => failpoints.hit("after_publish_before_confirm"));
      } catch (err) {
        log("publish failed; the row stays due", { job_id: row.id, error: String(err) });
        this.publisher.drop();
        await this.db.query(
          "UPDATE outbox SET locked_until = now() + interval '500 milliseconds' WHERE id = $1", [row.outbox_id],
        ).catch(() => undefined);
        return false;
      }
      metrics.inc("tsp_published_total");
      await this.db.query("UPDATE outbox SET published_at = now() WHERE id = $1", [row.outbox_id]);
      await this.db.query("UPDATE tasks SET last_published = now() WHERE id = $1", [row.id]);
    }
    return rows.length > 0;
  }
}
