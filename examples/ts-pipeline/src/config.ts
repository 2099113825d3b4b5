// Configuration: every setting comes from this service's own environment variables (TS_*), never from the
// grading harness's names; the adapter maps the harness's variables onto these with ${VAR} interpolation.
import { hostname } from "os";
import { randomUUID } from "crypto";

function req(name: string): string {
  const v = process.env[name];
  if (v === undefined || v === "") {
    throw new Error(`missing environment variable ${name}`);
  }
  return v;
}

function ms(name: string, dflt: number): number {
  const raw = process.env[name];
  if (raw === undefined || raw === "") return dflt;
  const n = Number(raw);
  if (!Number.isFinite(n) || n < 0) throw new Error(`${name}: not a number of milliseconds: ${raw}`);
  return n;
}

function int(name: string, dflt: number): number {
  const n = ms(name, dflt);
  if (!Number.isInteger(n)) throw new Error(`${name}: not an integer: ${process.env[name]}`);
  return n;
}

export interface Config {
  dbUrl: string;
  amqpUrls: string[];
  s3Endpoint: string;
  s3Bucket: string;
  port: number;
  variantLevel: number;
  adminToken: string;
  faults: string;
  metricsPort: number;
  leaseMs: number;
  renewMs: number;
  sweepMs: number;
  retryBaseMs: number;
  retryCapMs: number;
  maxAttempts: number;
  relayPollMs: number;
  relayLockMs: number;
  stagingRetentionMs: number;
  staleQueuedMs: number;
  jobTtlMs: number;
  ioTimeoutMs: number;
  decodeTimeoutMs: number;
  concurrency: number;
  prefetch: number;
  maxUploadBytes: number;
  maxUploadsInFlight: number;
  shutdownGraceMs: number;
  bugAckBeforeCommit: boolean;
  identity: string;
}

export function load(role: string): Config {
  const concurrency = int("TS_CONCURRENCY", 2);
  const amqpList = (process.env.TS_AMQP_NODES || "").split(",").map((s) => s.trim()).filter((s) => s);
  const amqpUrl = req("TS_AMQP_URL");
  return {
    dbUrl: req("TS_DB_URL"),
    amqpUrls: amqpList.length ? amqpList : [amqpUrl],
    s3Endpoint: req("TS_S3_ENDPOINT"),
    s3Bucket: req("TS_S3_BUCKET"),
    port: int("TS_PORT", 8080),
    variantLevel: int("TS_VARIANT_LEVEL", 4),
    adminToken: process.env.TS_ADMIN_TOKEN || "",
    faults: process.env.TS_FAULTS || "",
    metricsPort: int("TS_METRICS_PORT", 0),
    leaseMs: ms("TS_LEASE_MS", 30000),
    renewMs: ms("TS_LEASE_RENEW_MS", 10000),
    sweepMs: ms("TS_SWEEP_MS", 5000),
    retryBaseMs: ms("TS_RETRY_BASE_MS", 1000),
    retryCapMs: ms("TS_RETRY_CAP_MS", 600000),
    maxAttempts: int("TS_MAX_ATTEMPTS", 20),
    relayPollMs: ms("TS_RELAY_POLL_MS", 500),
    relayLockMs: ms("TS_RELAY_LOCK_MS", 5000),
    stagingRetentionMs: ms("TS_STAGING_RETENTION_MS", 3600000),
    staleQueuedMs: ms("TS_STALE_QUEUED_MS", 60000),
    jobTtlMs: ms("TS_JOB_TTL_MS", 86400000),
    ioTimeoutMs: ms("TS_IO_TIMEOUT_MS", 3000),
    decodeTimeoutMs: ms("TS_DECODE_TIMEOUT_MS", 20000),
    concurrency,
    prefetch: int("TS_PREFETCH", concurrency),
    maxUploadBytes: int("TS_MAX_UPLOAD_BYTES", 25 * 1024 * 1024),
    maxUploadsInFlight: int("TS_MAX_UPLOADS_IN_FLIGHT", 32),
    shutdownGraceMs: ms("TS_SHUTDOWN_GRACE_MS", 25000),
    bugAckBeforeCommit: process.env.TS_BUG_ACK_BEFORE_COMMIT === "1",
    identity: `${role}-${hostname()}-${process.pid}-${randomUUID().slice(0, 8)}`,
  };
}

export const STATES = { PENDING: "PENDING", RUNNING: "RUNNING", DONE: "DONE", ERROR: "ERROR" } as const;

export function variantsFor(level: number): string[] {
  return level >= 4 ? ["thumbnail", "crop", "optimized"] : ["thumbnail"];
}

export function log(msg: string, extra?: Record<string, unknown>): void {
  const line = { t: new Date().toISOString(), msg, ...(extra || {}) };
  process.stdout.write(JSON.stringify(line) + "\n");
}
