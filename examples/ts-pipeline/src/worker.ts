// The worker: consumes the work queue; claims a job with a lease (attempt counted at claim, fencing token bumped),
// renews the lease while it works, writes the renditions, commits DONE fenced by its token, then acks.
import { performance } from "perf_hooks";
import { Channel, ConsumeMessage } from "amqplib";
import { Pool, PoolClient } from "pg";
import { Config, log } from "./config";
import { logTransition, pool, tx } from "./db";
import { connect, declareTopology, WORK_QUEUE } from "./broker";
import * as failpoints from "./failpoints";
import type { Rendition } from "./images";
import * as messages from "./messages";
import * as metrics from "./metrics";
import type { Store } from "./s3";

// sharp and the S3 client take seconds to load on a busy machine: the worker connects and consumes first (a claim
// needs only the database), and loads them right after.
type Heavy = { images: typeof import("./images"); store: Store };

class LeaseLost extends Error {}
class Expired extends Error {}
class NotCommitted extends Error {}
// The store refused the request itself (403 AccessDenied, 400, 404): not an outage, retrying cannot help.
class StorageRefused extends Error {}

function refusedByStore(err: unknown): boolean {
  const status = (err as { $metadata?: { httpStatusCode?: number } }).$metadata?.httpStatusCode;
  return status !== undefined && status >= 400 && status < 500 && status !== 408 && status !== 429;
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

export function backoffMs(cfg: Config, attempt: number): number {
  // Full jitter: rand(0, min(cap, base * 2^(attempt-1))).
  const ceiling = Math.min(cfg.retryCapMs, cfg.retryBaseMs * Math.pow(2, Math.max(0, attempt - 1)));
  return Math.random() * ceiling;
}

interface Claim {
  taskId: string;
  fileId: string;
  attempt: number;
  fence: number;
  origKey: string;
  variants: string[];
  version: number;
  limit: number;
  leaseEnd: number;   // local monotonic ms
  expiresEnd: number; // local monotonic ms (never later than the database's deadline)
  lost: boolean;
}

type Settle = "ack" | "requeue" | "dead";

export class Worker {
  private db: Pool;
  private heavyP?: Promise<Heavy>;
  private stopping = false;
  private inflight = 0;

  constructor(private cfg: Config) {
    this.db = pool(cfg, cfg.prefetch * 2 + 4);
  }

  private heavy(): Promise<Heavy> {
    if (!this.heavyP) {
      this.heavyP = (async () => {
        const images = await import("./images");
        const { Store } = await import("./s3");
        return { images, store: new Store(this.cfg) };
      })();
    }
    return this.heavyP;
  }

  async run(): Promise<void> {
    let ch: Channel | undefined;
    let tag: string | undefined;
    let conn: Awaited<ReturnType<typeof connect>> | undefined;
    let stopped!: () => void;
    const stopSignal = new Promise<void>((resolve) => (stopped = resolve));
    const onTerm = () => {
      this.stopping = true;
      if (ch && tag) ch.cancel(tag).catch(() => undefined); // no new deliveries; those in flight finish
      stopped();
    };
    process.once("SIGTERM", onTerm);
    process.once("SIGINT", onTerm);
    while (!this.stopping) {
      try {
        const c = await connect(this.cfg, "worker");
        conn = c;
        const closed = new Promise<void>((resolve) => c.once("close", () => resolve()));
        ch = await conn.createChannel();
        ch.on("error", (err) => log("amqp channel error", { error: String(err) }));
        await declareTopology(ch);
        await ch.prefetch(this.cfg.prefetch, false);
        const channel = ch;
        const ok = await ch.consume(WORK_QUEUE, (msg) => {
          if (msg) this.handle(channel, msg);
        }, { noAck: false });
        tag = ok.consumerTag;
        log("worker consuming", { queue: WORK_QUEUE, prefetch: this.cfg.prefetch, identity: this.cfg.identity });
        this.heavy().catch((err) => log("loading the image and storage modules failed", { error: String(err) }));
        channel.once("close", () => c.close().catch(() => undefined));
        await Promise.race([closed, stopSignal, new Promise<void>((r) => channel.once("close", () => r()))]);
        if (!this.stopping) log("worker lost its broker connection; reconnecting");
      } catch (err) {
        if (!this.stopping) log("worker connect failed", { error: String(err) });
      }
      if (!this.stopping) await sleep(1000);
    }
    const until = performance.now() + this.cfg.shutdownGraceMs;
    while (this.inflight > 0 && performance.now() < until) await sleep(100);
    // Closing the connection returns every delivery still unacked (work past the grace period) to the queue.
    if (conn) await conn.close().catch(() => undefined);
    await this.db.end().catch(() => undefined);
  }

  private settle(ch: Channel, msg: ConsumeMessage, how: Settle): void {
    try {
      if (how === "ack") ch.ack(msg);
      else if (how === "requeue") ch.nack(msg, false, true);
      else ch.nack(msg, false, false); // dead-lettered through the queue's dead-letter exchange
    } catch (err) {
      log("could not settle a delivery (its channel is gone; the broker returns it)", { error: String(err) });
    }
  }

  private handle(ch: Channel, msg: ConsumeMessage): void {
    this.inflight += 1;
    this.process(ch, msg)
      .then((how) => {
        if (how) this.settle(ch, msg, how);
      })
      .catch((err) => {
        log("delivery failed unexpectedly; returning it", { error: String(err) });
        setTimeout(() => this.settle(ch, msg, "requeue"), 1000);
      })
      .finally(() => {
        this.inflight -= 1;
      });
  }

  // Returns how to settle the delivery, or null when it was settled already.
  private async process(ch: Channel, msg: ConsumeMessage): Promise<Settle | null> {
    const parsed = messages.parse(msg.content);
    if (typeof parsed === "string") {
      log("dead-lettering an unprocessable message", { reason: parsed });
      metrics.inc("tsp_dead_lettered_total", { reason: "invalid" });
      return "dead";
    }
    const job = parsed;
    let claim = await this.claimWaiting(job);
    // Owned by a live lease: hold the delivery until the owner finishes (then it is a no-op) or its lease runs
    // out (then this delivery takes the job over) — never ack a job nobody has finished: this may be the only
    // delivery left of a job whose owner died.
    const step = Math.max(100, Math.min(500, this.cfg.leaseMs / 8));
    for (let waited = 0; claim === "busy"; waited += step) {
      if (this.stopping || waited > 3 * this.cfg.leaseMs) return "requeue";
      await sleep(step);
      claim = await this.claimWaiting(job);
    }
    if (claim === null) return "requeue";
    if (claim === "ack" || claim === "dead") return claim;
    const c = claim;
    if (this.cfg.bugAckBeforeCommit) {
      // SEEDED BUG (TS_BUG_ACK_BEFORE_COMMIT=1): the delivery is acked as soon as the job is claimed.
      this.settle(ch, msg, "ack");
    }
    const renewer = setInterval(() => this.renew(c), this.cfg.renewMs);
    try {
      const how = await this.work(c);
      return this.cfg.bugAckBeforeCommit ? null : how;
    } finally {
      clearInterval(renewer);
    }
  }

  // Claims, waiting out a database outage while holding the delivery (an outage is not the job's error).
  private async claimWaiting(job: messages.JobMessage): Promise<Claim | "ack" | "dead" | "busy" | null> {
    for (let i = 0; ; i++) {
      try {
        return await this.claim(job);
      } catch (err) {
        if (this.stopping) return null;
        log("claim failed; retrying", { job_id: job.job_id, error: String(err) });
        await sleep(Math.min(2000, 200 * (i + 1)));
      }
    }
  }

  private async claim(job: messages.JobMessage): Promise<Claim | "ack" | "dead" | "busy"> {
    const t0 = performance.now();
    const me = this.cfg.identity;
    return tx(this.db, async (c) => {
      const r = await c.query(
        `SELECT t.*, f.orig_key, now() >= t.expires_at AS expired, t.not_before > now() + interval '50 milliseconds' AS early,
                (t.lease_until IS NOT NULL AND t.lease_until > now()) AS leased,
                extract(epoch FROM (t.expires_at - now())) * 1000 AS expires_in_ms
           FROM tasks t JOIN files f ON f.id = t.file_id WHERE t.id = $1 FOR UPDATE OF t`,
        [job.job_id],
      );
      if (!r.rows.length) {
        log("dead-lettering a message naming no known job", { job_id: job.job_id });
        metrics.inc("tsp_dead_lettered_total", { reason: "unknown_job" });
        return "dead";
      }
      const t = r.rows[0];
      if (t.file_id !== job.attachment_id) {
        metrics.inc("tsp_dead_lettered_total", { reason: "mismatch" });
        return "dead";
      }
      if (t.status === "DONE" || t.status === "ERROR") return "ack"; // finished: a duplicate is a no-op
      if (t.status === "RUNNING" && t.leased) return "busy";          // owned by a live lease: wait and look again
      const limit = this.cfg.maxAttempts * (1 + t.replays);
      if (t.status === "RUNNING") {
        // An expired lease nobody recovered yet: recorded as a recovery before the new claim.
        await c.query("UPDATE tasks SET status = 'PENDING', lease_owner = NULL, lease_until = NULL, updated_at = now() WHERE id = $1", [t.id]);
        await logTransition(c, t.id, t.file_id, "RUNNING", "PENDING", t.attempt, "lease expired; taken over", me);
        metrics.inc("tsp_leases_recovered_total");
      } else if (t.early) {
        return "ack"; // a copy arriving before its retry is due: the outbox publishes the due one
      }
      if (t.expired) {
        await c.query(
          "UPDATE tasks SET status = 'ERROR', error_code = 'expired', updated_at = now() WHERE id = $1", [t.id],
        );
        await logTransition(c, t.id, t.file_id, "PENDING", "ERROR", t.attempt, "deadline passed before the job started", me);
        metrics.inc("tsp_expired_jobs_total", { where: "claim" });
        return "ack";
      }
      if (t.attempt >= limit) {
        // Budget spent (e.g. a recovered lease on the last attempt): end it without a new attempt.
        await logTransition(c, t.id, t.file_id, "PENDING", "RUNNING", t.attempt, "claimed to close: no attempts left", me);
        await c.query(
          "UPDATE tasks SET status = 'ERROR', error_code = 'attempts_exhausted', updated_at = now() WHERE id = $1", [t.id],
        );
        await logTransition(c, t.id, t.file_id, "RUNNING", "ERROR", t.attempt, "no attempts left", me);
        metrics.inc("tsp_jobs_failed_total", { code: "attempts_exhausted" });
        return "ack";
      }
      const u = await c.query(
        `UPDATE tasks SET status = 'RUNNING', attempt = attempt + 1, fence = fence + 1, lease_owner = $2,
                lease_until = now() + make_interval(secs => $3::float8 / 1000), updated_at = now()
          WHERE id = $1 RETURNING attempt, fence`,
        [t.id, me, this.cfg.leaseMs],
      );
      const attempt = u.rows[0].attempt;
      await logTransition(c, t.id, t.file_id, "PENDING", "RUNNING", attempt, "claimed", me);
      return {
        taskId: t.id, fileId: t.file_id, attempt, fence: Number(u.rows[0].fence), origKey: t.orig_key,
        variants: t.variants, version: t.pipeline_version, limit,
        leaseEnd: t0 + this.cfg.leaseMs, expiresEnd: t0 + Number(t.expires_in_ms), lost: false,
      };
    });
  }

  private async renew(c: Claim): Promise<void> {
    if (c.lost) return;
    const sent = performance.now();
    try {
      const r = await this.db.query(
        `UPDATE tasks SET lease_until = now() + make_interval(secs => $3::float8 / 1000)
          WHERE id = $1 AND fence = $2 AND status = 'RUNNING' RETURNING 1`,
        [c.taskId, c.fence, this.cfg.leaseMs],
      );
      if (r.rowCount) c.leaseEnd = Math.max(c.leaseEnd, sent + this.cfg.leaseMs);
      else {
        c.lost = true;
        log("lease lost: the job was recovered or taken over", { job_id: c.taskId, fence: c.fence });
      }
    } catch (err) {
      log("lease renewal failed", { job_id: c.taskId, error: String(err) });
    }
  }

  // Before any effect: the lease must be held (wait for a renewal while it lapsed) and the deadline not passed.
  private async guard(c: Claim): Promise<void> {
    for (;;) {
      if (c.lost) throw new LeaseLost();
      const now = performance.now();
      if (now >= c.expiresEnd) throw new Expired();
      if (now < c.leaseEnd - 50) return;
      await sleep(100); // the lease lapsed: no new effect until a renewal gets through (or the lease is lost)
    }
  }

  private async s3<T>(c: Claim, what: string, fn: () => Promise<T>): Promise<T> {
    for (let i = 0; ; i++) {
      await this.guard(c);
      try {
        return await fn();
      } catch (err) {
        if (refusedByStore(err)) throw new StorageRefused(`${what} refused by the store: ${String(err).slice(0, 200)}`);
        if (i >= 4) throw err;
        log(`${what} failed; retrying`, { job_id: c.taskId, error: String(err) });
        await sleep(Math.min(2000, 250 * Math.pow(2, i)));
      }
    }
  }

  private async work(c: Claim): Promise<Settle> {
    let RenderFailed: typeof import("./images").RenderFailed | undefined;
    try {
      const { images, store } = await this.heavy();
      RenderFailed = images.RenderFailed;
      const original = await this.s3(c, "fetch of the original", () => store.get(c.origKey));
      await this.guard(c); // re-checks the deadline after a slow fetch
      const outs: Rendition[] = [];
      const source = sha256(original);
      for (const name of c.variants) {
        outs.push(await this.rendered(`${source}:${c.version}:${name}`,
          () => images.render(name, original, this.cfg.decodeTimeoutMs)));
      }
      const keys = new Map<string, string>();
      for (const r of outs) {
        // Deterministic key per effect key (file, version, variant): a redelivery rewrites the same bytes.
        const key = `renditions/${c.fileId}/v${c.version}/${r.name}.${r.ext}`;
        await this.s3(c, `write of ${r.name}`, () => store.put(key, r.body, r.contentType));
        keys.set(r.name, key);
      }
      await failpoints.hit("after_s3_write_before_commit");
      await this.commitDone(c, outs, keys);
      await failpoints.hit("after_commit_before_ack");
      return "ack";
    } catch (err) {
      if (err instanceof LeaseLost) {
        log("stopping: lease lost; the delivery goes back", { job_id: c.taskId });
        return "requeue";
      }
      if (err instanceof Expired) return this.expire(c);
      if (RenderFailed && err instanceof RenderFailed) return this.finishError(c, err.code, err.message);
      if (err instanceof StorageRefused) return this.finishError(c, "storage_refused", err.message);
      return this.retry(c, String((err as Error).message || err));
    }
  }

  // Renders are deterministic: a retry of the same original reuses this process's last renders (a small LRU)
  // instead of decoding again, so retries cost their I/O, not the CPU of a decode.
  private cache = new Map<string, Rendition>();

  private async rendered(key: string, make: () => Promise<Rendition>): Promise<Rendition> {
    const hit = this.cache.get(key);
    if (hit) {
      this.cache.delete(key);
      this.cache.set(key, hit);
      return hit;
    }
    const r = await make();
    if (r.body.length <= 4 * 1024 * 1024) {
      this.cache.set(key, r);
      while (this.cache.size > 48) this.cache.delete(this.cache.keys().next().value as string);
    }
    return r;
  }

  private async commitDone(c: Claim, outs: Rendition[], keys: Map<string, string>): Promise<void> {
    for (let i = 0; ; i++) {
      await this.guard(c);
      try {
        const ok = await tx(this.db, async (q) => {
          const own = await q.query("SELECT 1 FROM tasks WHERE id = $1 AND fence = $2 AND status = 'RUNNING' FOR UPDATE", [c.taskId, c.fence]);
          if (!own.rowCount) return false;
          for (const r of outs) {
            await q.query(
              `INSERT INTO renditions (file_id, pipeline_version, name, key, sha256, size, content_type, width, height)
               VALUES ($1,$2,$3,$4,$5,$6,$7,$8,$9)
               ON CONFLICT (file_id, pipeline_version, name) DO UPDATE SET key = EXCLUDED.key, sha256 = EXCLUDED.sha256,
                 size = EXCLUDED.size, content_type = EXCLUDED.content_type, width = EXCLUDED.width, height = EXCLUDED.height`,
              [c.fileId, c.version, r.name, keys.get(r.name), sha256(r.body), r.body.length, r.contentType, r.width, r.height],
            );
          }
          // Last statement before COMMIT: fenced, and the deadline judged by the database's clock at this instant
          // (not the transaction's start); the event carries that instant.
          const u = await q.query(
            `UPDATE tasks SET status = 'DONE', lease_owner = NULL, lease_until = NULL, error_code = NULL,
                    updated_at = clock_timestamp()
              WHERE id = $1 AND fence = $2 AND status = 'RUNNING' AND clock_timestamp() < expires_at
              RETURNING updated_at`,
            [c.taskId, c.fence],
          );
          if (!u.rowCount) throw new NotCommitted();
          await q.query(
            `INSERT INTO task_log (task_id, file_id, at, from_status, to_status, attempt, reason, actor)
             VALUES ($1, $2, $3, 'RUNNING', 'DONE', $4, 'renditions committed', $5)`,
            [c.taskId, c.fileId, u.rows[0].updated_at, c.attempt, this.cfg.identity],
          );
          return true;
        });
        if (ok) {
          metrics.inc("tsp_jobs_done_total");
          return;
        }
        const s = await this.db.query(
          "SELECT status, fence, now() >= expires_at AS expired FROM tasks WHERE id = $1", [c.taskId],
        );
        const t = s.rows[0];
        if (t && t.status === "RUNNING" && Number(t.fence) === c.fence && t.expired) throw new Expired();
        c.lost = true;
        throw new LeaseLost();
      } catch (err) {
        if (err instanceof LeaseLost || err instanceof Expired) throw err;
        if (err instanceof NotCommitted) {
          // Rolled back: fenced off or past the deadline. Which one, read afresh.
          const s2 = await this.db.query("SELECT status, fence, now() >= expires_at AS expired FROM tasks WHERE id = $1", [c.taskId]);
          const t2 = s2.rows[0];
          if (t2 && t2.status === "RUNNING" && Number(t2.fence) === c.fence && t2.expired) throw new Expired();
          if (t2 && t2.status === "RUNNING" && Number(t2.fence) === c.fence) throw new Expired(); // clock_timestamp passed it
          c.lost = true;
          throw new LeaseLost();
        }
        if (i >= 20) throw err;
        log("commit failed; retrying while the lease holds", { job_id: c.taskId, error: String(err) });
        await sleep(Math.min(1000, 100 * (i + 1)));
      }
    }
  }

  // A fenced terminal or retry transition; retried while the database is unreachable and the lease is ours.
  private async fenced(c: Claim, fn: (q: PoolClient) => Promise<void>): Promise<Settle> {
    for (let i = 0; ; i++) {
      try {
        const ok = await tx(this.db, async (q) => {
          const r = await q.query("SELECT 1 FROM tasks WHERE id = $1 AND fence = $2 AND status = 'RUNNING' FOR UPDATE", [c.taskId, c.fence]);
          if (!r.rowCount) return false;
          await fn(q);
          return true;
        });
        return ok ? "ack" : "requeue";
      } catch (err) {
        if (c.lost || i >= 30) {
          log("could not record the outcome; the delivery goes back", { job_id: c.taskId, error: String(err) });
          return "requeue";
        }
        await sleep(Math.min(1000, 100 * (i + 1)));
      }
    }
  }

  private async expire(c: Claim): Promise<Settle> {
    // Expiry is judged on the database's clock: wait until it agrees the deadline passed, then record it.
    for (let i = 0; i < 50; i++) {
      let notYet = false;
      const how = await this.fenced(c, async (q) => {
        const r = await q.query("SELECT now() >= expires_at AS expired FROM tasks WHERE id = $1", [c.taskId]);
        if (!r.rows[0].expired) {
          notYet = true;
          throw new Error("not yet expired");
        }
        await q.query("UPDATE tasks SET status = 'ERROR', error_code = 'expired', lease_owner = NULL, lease_until = NULL, updated_at = now() WHERE id = $1", [c.taskId]);
        await logTransition(q, c.taskId, c.fileId, "RUNNING", "ERROR", c.attempt, "deadline passed while processing", this.cfg.identity);
        // Counted before the commit: once the expiry is visible, the counter already has it (a commit that
        // fails after this over-counts, never under-counts).
        metrics.inc("tsp_expired_jobs_total", { where: "processing" });
      }).catch(() => "requeue" as Settle);
      if (!notYet) return how;
      await sleep(100);
    }
    return "requeue";
  }

  private async finishError(c: Claim, code: string, why: string): Promise<Settle> {
    log("job failed permanently", { job_id: c.taskId, code, why });
    const how = await this.fenced(c, async (q) => {
      await q.query("UPDATE tasks SET status = 'ERROR', error_code = $2, last_reason = $3, lease_owner = NULL, lease_until = NULL, updated_at = now() WHERE id = $1", [c.taskId, code, why]);
      await logTransition(q, c.taskId, c.fileId, "RUNNING", "ERROR", c.attempt, `permanent: ${code}`, this.cfg.identity);
    });
    if (how === "ack") metrics.inc("tsp_jobs_failed_total", { code });
    return how;
  }

  private async retry(c: Claim, why: string): Promise<Settle> {
    if (c.attempt >= c.limit) return this.finishError(c, "attempts_exhausted", `last error: ${why}`.slice(0, 300));
    const delay = backoffMs(this.cfg, c.attempt);
    log("transient error; retrying later", { job_id: c.taskId, attempt: c.attempt, delay_ms: Math.round(delay), why });
    const how = await this.fenced(c, async (q) => {
      await q.query(
        `UPDATE tasks SET status = 'PENDING', lease_owner = NULL, lease_until = NULL, last_reason = $2,
                not_before = now() + make_interval(secs => $3::float8 / 1000), updated_at = now() WHERE id = $1`,
        [c.taskId, "transient error", delay],
      );
      await logTransition(q, c.taskId, c.fileId, "RUNNING", "PENDING", c.attempt, "transient error; retry scheduled", this.cfg.identity);
      await q.query("INSERT INTO outbox (task_id, available_at) VALUES ($1, now() + make_interval(secs => $2::float8 / 1000))", [c.taskId, delay]);
    });
    if (how === "ack") metrics.inc("tsp_retries_total");
    return how;
  }
}

function sha256(b: Buffer): string {
  return require("crypto").createHash("sha256").update(b).digest("hex");
}
