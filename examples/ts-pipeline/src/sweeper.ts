// The sweeper: recovers expired leases, expires waiting jobs past their deadline, republishes jobs whose message
// was lost (only when the work queue holds nothing), and deletes orphan staging objects after their retention.
import { Channel, Connection } from "amqplib";
import { Pool } from "pg";
import { Config, log } from "./config";
import { logTransition, pool, tx } from "./db";
import { connect, declareTopology, WORK_QUEUE } from "./broker";
import * as metrics from "./metrics";
import { Store } from "./s3";

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

export class Sweeper {
  private db: Pool;
  private store: Store;
  private conn?: Connection;
  private ch?: Channel;
  private stopping = false;

  constructor(private cfg: Config) {
    this.db = pool(cfg, 4);
    this.store = new Store(cfg);
  }

  async run(): Promise<void> {
    const onTerm = () => {
      this.stopping = true;
    };
    process.once("SIGTERM", onTerm);
    process.once("SIGINT", onTerm);
    log("sweeper started", { identity: this.cfg.identity, every_ms: this.cfg.sweepMs });
    while (!this.stopping) {
      for (const [name, step] of [
        ["lease recovery", () => this.recoverLeases()],
        ["expiry", () => this.expireWaiting()],
        ["republish", () => this.republishLost()],
        ["staging cleanup", () => this.cleanStaging()],
      ] as [string, () => Promise<void>][]) {
        if (this.stopping) break;
        try {
          await step();
        } catch (err) {
          log(`sweep step failed: ${name}`, { error: String(err) });
        }
      }
      await sleep(this.cfg.sweepMs);
    }
    if (this.conn) await this.conn.close().catch(() => undefined);
    await this.db.end().catch(() => undefined);
  }

  private async recoverLeases(): Promise<void> {
    const me = this.cfg.identity;
    await tx(this.db, async (c) => {
      const r = await c.query(
        `SELECT id, file_id, attempt, replays, now() >= expires_at AS expired FROM tasks
          WHERE status = 'RUNNING' AND lease_until < now() ORDER BY lease_until LIMIT 100 FOR UPDATE SKIP LOCKED`,
      );
      for (const t of r.rows) {
        if (t.expired) {
          await c.query("UPDATE tasks SET status = 'ERROR', error_code = 'expired', lease_owner = NULL, lease_until = NULL, updated_at = now() WHERE id = $1", [t.id]);
          await logTransition(c, t.id, t.file_id, "RUNNING", "ERROR", t.attempt, "lease expired after the deadline", me);
          metrics.inc("tsp_expired_jobs_total", { where: "sweeper" });
        } else if (t.attempt >= this.cfg.maxAttempts * (1 + t.replays)) {
          await c.query("UPDATE tasks SET status = 'ERROR', error_code = 'attempts_exhausted', lease_owner = NULL, lease_until = NULL, updated_at = now() WHERE id = $1", [t.id]);
          await logTransition(c, t.id, t.file_id, "RUNNING", "ERROR", t.attempt, "lease expired on the last attempt", me);
          metrics.inc("tsp_jobs_failed_total", { code: "attempts_exhausted" });
        } else {
          await c.query("UPDATE tasks SET status = 'PENDING', lease_owner = NULL, lease_until = NULL, not_before = now(), updated_at = now() WHERE id = $1", [t.id]);
          await logTransition(c, t.id, t.file_id, "RUNNING", "PENDING", t.attempt, "lease expired; recovered", me);
          await c.query("INSERT INTO outbox (task_id) VALUES ($1)", [t.id]);
          metrics.inc("tsp_leases_recovered_total");
        }
      }
      if (r.rows.length) log("leases recovered", { count: r.rows.length });
    });
  }

  private async expireWaiting(): Promise<void> {
    const me = this.cfg.identity;
    await tx(this.db, async (c) => {
      const r = await c.query(
        `SELECT id, file_id, attempt FROM tasks WHERE status = 'PENDING' AND expires_at <= now()
          LIMIT 200 FOR UPDATE SKIP LOCKED`,
      );
      for (const t of r.rows) {
        await c.query("UPDATE tasks SET status = 'ERROR', error_code = 'expired', updated_at = now() WHERE id = $1", [t.id]);
        await logTransition(c, t.id, t.file_id, "PENDING", "ERROR", t.attempt, "deadline passed while waiting", me);
        metrics.inc("tsp_expired_jobs_total", { where: "sweeper" });
      }
    });
  }

  private async queueDepth(): Promise<number | null> {
    try {
      if (!this.ch) {
        if (!this.conn) {
          const conn = await connect(this.cfg, "sweeper");
          conn.on("close", () => {
            this.conn = undefined;
            this.ch = undefined;
          });
          this.conn = conn;
        }
        const ch = await this.conn.createChannel();
        ch.on("error", () => undefined);
        ch.on("close", () => {
          if (this.ch === ch) this.ch = undefined;
        });
        await declareTopology(ch);
        this.ch = ch;
      }
      const q = await this.ch.checkQueue(WORK_QUEUE);
      return q.messageCount;
    } catch (err) {
      log("could not read the work queue's depth", { error: String(err) });
      this.ch = undefined;
      return null;
    }
  }

  // A waiting job whose message is gone (nothing waits in the work queue, and none was published for a while)
  // gets a new one. Never while messages wait in the queue: a held consumer's backlog is not lost.
  private async republishLost(): Promise<void> {
    if (!this.cfg.staleQueuedMs) return;
    const depth = await this.queueDepth();
    if (depth === null || depth > 0) return;
    await tx(this.db, async (c) => {
      const r = await c.query(
        `SELECT t.id FROM tasks t
          WHERE t.status = 'PENDING'
            AND t.not_before <= now() - make_interval(secs => $1::float8 / 1000)
            AND coalesce(t.last_published, t.created_at) <= now() - make_interval(secs => $1::float8 / 1000)
            AND NOT EXISTS (SELECT 1 FROM outbox o WHERE o.task_id = t.id AND o.published_at IS NULL)
          LIMIT 100 FOR UPDATE OF t SKIP LOCKED`,
        [this.cfg.staleQueuedMs],
      );
      for (const t of r.rows) {
        await c.query("INSERT INTO outbox (task_id) VALUES ($1)", [t.id]);
        await c.query("UPDATE tasks SET last_published = now() WHERE id = $1", [t.id]);
      }
      if (r.rows.length) log("republishing waiting jobs with no message", { count: r.rows.length });
    });
  }

  private async cleanStaging(): Promise<void> {
    const objects = await this.store.list("staging/");
    if (!objects.length) return;
    const now = (await this.db.query("SELECT now() AS now")).rows[0].now as Date; // one clock: the database's
    const old = objects.filter((o) => now.getTime() - o.modified.getTime() > this.cfg.stagingRetentionMs);
    if (!old.length) return;
    const r = await this.db.query("SELECT orig_key FROM files WHERE orig_key = ANY($1::text[])", [old.map((o) => o.key)]);
    const kept = new Set(r.rows.map((x) => x.orig_key));
    for (const o of old) {
      if (kept.has(o.key)) continue;
      await this.store.del(o.key);
      metrics.inc("tsp_staging_deleted_total");
      log("deleted an orphan staging object", { key: o.key });
    }
  }
}
