// The job message (schemas/jobs.schema.json): identifiers and service data only.
export interface JobMessage {
  schema_version: 1;
  job_id: string;
  attempt: number;
  attachment_id: string;
  pipeline_version: number;
  variants: string[];
  created_at: string;
  expires_at: string;
}

const UUID = /^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$/;
const TS = /^\d{4}-\d{2}-\d{2}[Tt]\d{2}:\d{2}:\d{2}(\.\d+)?([Zz]|[+-]00:00)$/;
const VARIANTS = new Set(["thumbnail", "crop", "optimized"]);

export function build(row: {
  id: string; file_id: string; attempt: number; pipeline_version: number; variants: string[];
  created_at: Date; expires_at: Date; status: string;
}): JobMessage {
  return {
    schema_version: 1,
    job_id: row.id,
    // Attempts are counted at claim: a waiting job's message names the attempt its next claim will start.
    attempt: row.status === "PENDING" ? row.attempt + 1 : Math.max(1, row.attempt),
    attachment_id: row.file_id,
    pipeline_version: row.pipeline_version,
    variants: row.variants,
    created_at: row.created_at.toISOString(),
    expires_at: row.expires_at.toISOString(),
  };
}

// Returns the message, or a reason why it can never be processed.
export function parse(body: Buffer): JobMessage | string {
  let v: unknown;
  try {
    v = JSON.parse(body.toString("utf8"));
  } catch {
    return "body is not JSON";
  }
  if (typeof v !== "object" || v === null || Array.isArray(v)) return "body is not a JSON object";
  const m = v as Record<string, unknown>;
  if (m.schema_version !== 1) return "schema_version is not 1";
  if (typeof m.job_id !== "string" || !UUID.test(m.job_id)) return "job_id is not a UUID";
  if (typeof m.attachment_id !== "string" || !UUID.test(m.attachment_id)) return "attachment_id is not a UUID";
  if (!Number.isInteger(m.attempt) || (m.attempt as number) < 1) return "attempt is not an integer >= 1";
  if (!Number.isInteger(m.pipeline_version) || (m.pipeline_version as number) < 1) return "pipeline_version is not an integer >= 1";
  if (!Array.isArray(m.variants) || !m.variants.length || !m.variants.every((x) => typeof x === "string" && VARIANTS.has(x))) {
    return "variants is not a list of known variants";
  }
  if (typeof m.created_at !== "string" || !TS.test(m.created_at)) return "created_at is not an RFC 3339 UTC time";
  if (typeof m.expires_at !== "string" || !TS.test(m.expires_at)) return "expires_at is not an RFC 3339 UTC time";
  return {
    schema_version: 1,
    job_id: m.job_id.toLowerCase(),
    attempt: m.attempt as number,
    attachment_id: m.attachment_id.toLowerCase(),
    pipeline_version: m.pipeline_version as number,
    variants: m.variants as string[],
    created_at: m.created_at,
    expires_at: m.expires_at,
  };
}
