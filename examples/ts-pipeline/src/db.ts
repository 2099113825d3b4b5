// PostgreSQL: pool with timeouts, transactions, schema.
import { Pool, PoolClient } from "pg";
import { Config, log } from "./config";

export function pool(cfg: Config, max = 10): Pool {
  const p = new Pool({
    connectionString: cfg.dbUrl,
    max,
    connectionTimeoutMillis: cfg.ioTimeoutMs,
    query_timeout: cfg.ioTimeoutMs,
    statement_timeout: cfg.ioTimeoutMs,
    idleTimeoutMillis: 10000,
    keepAlive: true,
  });
  p.on("error", (err) => log("database pool error", { error: String(err) }));
  return p;
}

export async function tx<T>(p: Pool, fn: (c: PoolClient) => Promise<T>): Promise<T> {
  const c = await p.connect();
  let broken: Error | undefined;
  // A checked-out client whose connection ends emits 'error' (the pool's own listener is for idle clients only);
  // unheard, that event ends the process. Heard, the transaction's next query fails and the client is destroyed.
  const lost = (err: Error) => {
    broken = err;
    log("database connection lost in a transaction", { error: String(err) });
  };
  c.on("error", lost);
  try {
    await c.query("BEGIN");
    const out = await fn(c);
    await c.query("COMMIT");
    return out;
  } catch (err) {
    broken = err as Error;
    try {
      await c.query("ROLLBACK");
      broken = undefined; // the connection is still usable
    } catch {
      /* connection is gone: destroy it */
    }
    throw err;
  } finally {
    c.off("error", lost);
    c.release(broken);
  }
}

// The schema. Every table is this service's own vocabulary; the adapter maps its states and reads its log.
export const SCHEMA = `
CREATE TABLE IF NOT EXISTS files (
  id            uuid PRIMARY KEY,
  idem_key      text UNIQUE,
  orig_key      text NOT NULL,
  orig_sha256   text NOT NULL,
  orig_size     bigint NOT NULL,
  orig_type     text NOT NULL,
  display_name  text,
  created_at    timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE IF NOT EXISTS tasks (
  id               uuid PRIMARY KEY,
  file_id          uuid NOT NULL UNIQUE REFERENCES files(id),
  pipeline_version int NOT NULL DEFAULT 1,
  status           text NOT NULL CHECK (status IN ('PENDING','RUNNING','DONE','ERROR')),
  attempt          int NOT NULL DEFAULT 0,
  replays          int NOT NULL DEFAULT 0,
  fence            bigint NOT NULL DEFAULT 0,
  lease_owner      text,
  lease_until      timestamptz,
  not_before       timestamptz NOT NULL DEFAULT now(),
  variants         text[] NOT NULL,
  error_code       text,
  last_reason      text,
  expires_at       timestamptz NOT NULL,
  last_published   timestamptz,
  created_at       timestamptz NOT NULL DEFAULT now(),
  updated_at       timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS tasks_status ON tasks (status, lease_until);
CREATE TABLE IF NOT EXISTS renditions (
  file_id          uuid NOT NULL REFERENCES files(id),
  pipeline_version int NOT NULL,
  name             text NOT NULL,
  key              text NOT NULL,
  sha256           text NOT NULL,
  size             bigint NOT NULL,
  content_type     text NOT NULL,
  width            int,
  height           int,
  PRIMARY KEY (file_id, pipeline_version, name)
);
CREATE TABLE IF NOT EXISTS outbox (
  id            bigserial PRIMARY KEY,
  task_id       uuid NOT NULL REFERENCES tasks(id),
  available_at  timestamptz NOT NULL DEFAULT now(),
  locked_until  timestamptz,
  tries         int NOT NULL DEFAULT 0,
  published_at  timestamptz
);
CREATE INDEX IF NOT EXISTS outbox_due ON outbox (available_at) WHERE published_at IS NULL;
CREATE TABLE IF NOT EXISTS task_log (
  seq         bigserial PRIMARY KEY,
  task_id     uuid NOT NULL,
  file_id     uuid NOT NULL,
  at          timestamptz NOT NULL DEFAULT clock_timestamp(),
  from_status text,
  to_status   text NOT NULL,
  attempt     int NOT NULL,
  reason      text,
  actor       text NOT NULL
);
CREATE INDEX IF NOT EXISTS task_log_file ON task_log (file_id, seq);
CREATE TABLE IF NOT EXISTS operator_audit (
  id          bigserial PRIMARY KEY,
  task_id     uuid NOT NULL,
  action      text NOT NULL,
  who         text NOT NULL,
  why         text,
  at          timestamptz NOT NULL DEFAULT now()
);
`;

export async function migrate(p: Pool): Promise<void> {
  await tx(p, async (c) => {
    await c.query("SELECT pg_advisory_xact_lock(727272)");
    await c.query(SCHEMA);
  });
}

export async function logTransition(
  c: PoolClient, taskId: string, fileId: string, from: string | null, to: string, attempt: number,
  reason: string, actor: string,
): Promise<void> {
  await c.query(
    "INSERT INTO task_log (task_id, file_id, from_status, to_status, attempt, reason, actor) VALUES ($1,$2,$3,$4,$5,$6,$7)",
    [taskId, fileId, from, to, attempt, reason, actor],
  );
}
