// The HTTP role: uploads, status, operator retry, health, metrics at /prom. Hosts the outbox relay.
// No events endpoint: the transition log is the `task_log` table, read by the adapter's SQL query.
import { createHash, randomUUID } from "crypto";
import Fastify, { FastifyReply, FastifyRequest } from "fastify";
import multipart from "@fastify/multipart";
import { Pool } from "pg";
import { Config, log, variantsFor } from "./config";
import { logTransition, pool, tx } from "./db";
import * as failpoints from "./failpoints";
import { ImageRejected, inspect, sniff } from "./images";
import * as metrics from "./metrics";
import { Relay } from "./relay";
import { Store } from "./s3";

const UUID = /^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$/;

class HttpError extends Error {
  constructor(public status: number, public code: string, message: string, public retryAfter?: number) {
    super(message);
  }
}

function fail(reply: FastifyReply, err: HttpError): FastifyReply {
  if (err.retryAfter) reply.header("Retry-After", String(err.retryAfter));
  return reply.code(err.status).send({ error: { code: err.code, message: err.message } });
}

function unavailable(what: string, err: unknown): HttpError {
  log(`${what} unavailable`, { error: String(err) });
  return new HttpError(503, "dependency_unavailable", `${what} is unavailable, retry later`, 1);
}

export async function runApi(cfg: Config): Promise<void> {
  const db: Pool = pool(cfg, 20);
  const store = new Store(cfg);
  const relay = new Relay(cfg, db);
  let inFlight = 0;

  const app = Fastify({ logger: false, bodyLimit: cfg.maxUploadBytes + 1024 * 1024 });
  await app.register(multipart, {
    limits: { fileSize: cfg.maxUploadBytes, files: 1, fields: 10, parts: 20 },
  });

  app.get("/health", async () => ({ ok: true }));
  app.get("/prom", async (_req, reply) => reply.type("text/plain; version=0.0.4").send(metrics.render()));

  async function existingForKey(key: string, sha: string): Promise<{ attachment_id: string; job_id: string } | null> {
    const r = await db.query(
      "SELECT f.id, f.orig_sha256, t.id AS task_id FROM files f JOIN tasks t ON t.file_id = f.id WHERE f.idem_key = $1",
      [key],
    );
    if (!r.rows.length) return null;
    if (r.rows[0].orig_sha256 !== sha) {
      throw new HttpError(409, "idempotency_conflict", "this Idempotency-Key was used with other content");
    }
    return { attachment_id: r.rows[0].id, job_id: r.rows[0].task_id };
  }

  function accepted(reply: FastifyReply, ids: { attachment_id: string; job_id: string }): FastifyReply {
    return reply.code(202).send({ ...ids, status_url: `/v1/files/${ids.attachment_id}` });
  }

  app.post("/v1/files", async (req: FastifyRequest, reply: FastifyReply) => {
    if (inFlight >= cfg.maxUploadsInFlight) {
      return fail(reply, new HttpError(503, "overloaded", "too many uploads in progress", 1));
    }
    inFlight += 1;
    try {
      return await upload(req, reply);
    } catch (err) {
      if (err instanceof HttpError) return fail(reply, err);
      const code = (err as { code?: string }).code;
      if (code === "FST_REQ_FILE_TOO_LARGE") return fail(reply, new HttpError(413, "too_large", "the file exceeds the size limit"));
      if (code && code.startsWith("FST_")) return fail(reply, new HttpError(400, "bad_request", String((err as Error).message)));
      return fail(reply, unavailable("a dependency", err));
    } finally {
      inFlight -= 1;
    }
  });

  async function upload(req: FastifyRequest, reply: FastifyReply): Promise<FastifyReply> {
    if (!req.isMultipart()) throw new HttpError(400, "bad_request", "expected multipart/form-data with a field 'file'");
    const idemRaw = req.headers["idempotency-key"];
    const idem = typeof idemRaw === "string" && idemRaw.length ? idemRaw.slice(0, 200) : null;
    let data: Buffer | null = null;
    let displayName: string | null = null;
    for await (const part of req.parts()) {
      if (part.type === "file") {
        if (part.fieldname !== "file" || data) {
          await part.toBuffer().catch(() => undefined);
          continue;
        }
        data = await part.toBuffer(); // throws FST_REQ_FILE_TOO_LARGE past the cap, counted while streaming
        displayName = part.filename ? part.filename.slice(0, 255) : null;
      }
    }
    if (!data || !data.length) throw new HttpError(400, "no_file", "multipart field 'file' is missing or empty");
    const type = sniff(data.subarray(0, 16));
    if (!type) throw new HttpError(415, "unsupported_type", "not a JPEG, PNG, WebP or GIF image");
    try {
      await inspect(data);
    } catch (err) {
      if (err instanceof ImageRejected) throw new HttpError(422, err.code, err.message);
      throw err;
    }
    const sha = createHash("sha256").update(data).digest("hex");
    if (idem) {
      let prior;
      try {
        prior = await existingForKey(idem, sha);
      } catch (err) {
        if (err instanceof HttpError) throw err;
        throw unavailable("the database", err);
      }
      if (prior) return accepted(reply, prior);
    }
    const fileId = randomUUID();
    const taskId = randomUUID();
    const key = `staging/${fileId}`; // generated by the server: never the client's filename
    const stagedAt = Date.now();
    try {
      await store.put(key, data, type);
    } catch (err) {
      throw unavailable("object storage", err);
    }
    await failpoints.hit("after_staging_before_record");
    if (Date.now() - stagedAt > cfg.stagingRetentionMs / 2) {
      // The staged object may be swept as an orphan soon: do not record an attachment that could lose it.
      throw new HttpError(503, "dependency_unavailable", "staging took too long, retry later", 1);
    }
    let inserted: boolean;
    try {
      inserted = await tx(db, async (c) => {
        const f = await c.query(
          `INSERT INTO files (id, idem_key, orig_key, orig_sha256, orig_size, orig_type, display_name)
           VALUES ($1,$2,$3,$4,$5,$6,$7) ON CONFLICT (idem_key) DO NOTHING RETURNING id`,
          [fileId, idem, key, sha, data!.length, type, displayName],
        );
        if (!f.rows.length) return false;
        await c.query(
          `INSERT INTO tasks (id, file_id, status, variants, expires_at)
           VALUES ($1, $2, 'PENDING', $3, now() + make_interval(secs => $4::float8 / 1000))`,
          [taskId, fileId, variantsFor(cfg.variantLevel), cfg.jobTtlMs],
        );
        await logTransition(c, taskId, fileId, null, "PENDING", 0, "uploaded", cfg.identity);
        await c.query("INSERT INTO outbox (task_id) VALUES ($1)", [taskId]);
        return true;
      });
    } catch (err) {
      throw unavailable("the database", err);
    }
    if (!inserted) {
      // A concurrent upload with the same key won: answer as it did (its staged copy is ours to lose).
      const prior = await existingForKey(idem!, sha).catch((err) => {
        if (err instanceof HttpError) throw err;
        throw unavailable("the database", err);
      });
      if (!prior) throw new HttpError(503, "dependency_unavailable", "retry later", 1);
      return accepted(reply, prior);
    }
    relay.kick();
    return accepted(reply, { attachment_id: fileId, job_id: taskId });
  }

  app.get("/v1/files/:id", async (req, reply) => {
    const id = (req.params as { id: string }).id;
    if (!UUID.test(id)) return fail(reply, new HttpError(404, "not_found", "no such file"));
    let r;
    try {
      r = await db.query(
        `SELECT f.id, f.orig_key, f.orig_sha256, f.orig_size, f.orig_type, f.display_name, f.created_at,
                t.id AS task_id, t.status, t.attempt, t.error_code, t.pipeline_version, t.updated_at
           FROM files f JOIN tasks t ON t.file_id = f.id WHERE f.id = $1`,
        [id.toLowerCase()],
      );
    } catch (err) {
      return fail(reply, unavailable("the database", err));
    }
    if (!r.rows.length) return fail(reply, new HttpError(404, "not_found", "no such file"));
    const row = r.rows[0];
    let variants: unknown[] = [];
    if (row.status === "DONE") {
      try {
        const v = await db.query(
          `SELECT name, key, sha256, size, content_type, width, height FROM renditions
            WHERE file_id = $1 AND pipeline_version = $2 ORDER BY name`,
          [row.id, row.pipeline_version],
        );
        variants = v.rows.map((x) => ({ ...x, size: Number(x.size) }));
      } catch (err) {
        return fail(reply, unavailable("the database", err));
      }
    }
    return reply.send({
      attachment_id: row.id,
      job_id: row.task_id,
      state: row.status,
      pipeline_version: row.pipeline_version,
      attempt: row.attempt,
      error_code: row.error_code,
      filename: row.display_name,
      original: { key: row.orig_key, sha256: row.orig_sha256, size: Number(row.orig_size), content_type: row.orig_type },
      variants,
      created_at: row.created_at.toISOString(),
      updated_at: row.updated_at.toISOString(),
    });
  });

  app.post("/v1/ops/files/:id/retry", async (req, reply) => {
    const auth = req.headers.authorization || "";
    const m = /^Bearer\s+(.+)$/i.exec(auth);
    if (!m) return fail(reply, new HttpError(401, "unauthorized", "an operator token is required"));
    if (!cfg.adminToken || m[1].trim() !== cfg.adminToken) return fail(reply, new HttpError(403, "forbidden", "wrong operator token"));
    const id = (req.params as { id: string }).id;
    if (!UUID.test(id)) return fail(reply, new HttpError(404, "not_found", "no such file"));
    const body = (req.body || {}) as { reason?: unknown };
    const reason = typeof body.reason === "string" ? body.reason.slice(0, 500) : "operator retry";
    try {
      const out = await tx(db, async (c) => {
        const r = await c.query(
          "SELECT id, file_id, status, attempt FROM tasks WHERE file_id = $1 FOR UPDATE", [id.toLowerCase()],
        );
        if (!r.rows.length) throw new HttpError(404, "not_found", "no such file");
        const t = r.rows[0];
        if (t.status !== "ERROR") throw new HttpError(409, "not_failed", `the job is ${t.status}, not ERROR`);
        await c.query(
          `UPDATE tasks SET status = 'PENDING', replays = replays + 1, error_code = NULL, lease_owner = NULL,
                  lease_until = NULL, not_before = now(), last_reason = $2, updated_at = now() WHERE id = $1`,
          [t.id, `operator retry: ${reason}`],
        );
        await logTransition(c, t.id, t.file_id, "ERROR", "PENDING", t.attempt, `operator retry: ${reason}`, "operator");
        await c.query("INSERT INTO operator_audit (task_id, action, who, why) VALUES ($1, 'retry', 'operator', $2)", [t.id, reason]);
        await c.query("INSERT INTO outbox (task_id) VALUES ($1)", [t.id]);
        return { attachment_id: t.file_id, job_id: t.id, attempt: t.attempt + 1 };
      });
      relay.kick();
      return reply.code(202).send(out);
    } catch (err) {
      if (err instanceof HttpError) return fail(reply, err);
      return fail(reply, unavailable("the database", err));
    }
  });

  await app.listen({ port: cfg.port, host: "127.0.0.1" });
  log("api listening", { port: cfg.port, identity: cfg.identity });
  const relayDone = relay.run();

  await new Promise<void>((resolve) => {
    const stop = () => resolve();
    process.once("SIGTERM", stop);
    process.once("SIGINT", stop);
  });
  log("api stopping");
  relay.stop();
  await Promise.race([Promise.all([app.close(), relayDone]), new Promise((r) => setTimeout(r, cfg.shutdownGraceMs))]);
  await db.end().catch(() => undefined);
}
