// A tiny Prometheus text registry, served at /prom.
import http from "http";

const counters = new Map<string, number>();
const help = new Map<string, string>();

export function define(name: string, text: string): void {
  help.set(name, text);
}

export function inc(name: string, labels: Record<string, string> = {}, by = 1): void {
  const key = name + labelText(labels);
  counters.set(key, (counters.get(key) || 0) + by);
}

function labelText(labels: Record<string, string>): string {
  const keys = Object.keys(labels).sort();
  if (!keys.length) return "";
  return "{" + keys.map((k) => `${k}="${labels[k].replace(/["\\\n]/g, "_")}"`).join(",") + "}";
}

export function render(): string {
  const out: string[] = [];
  for (const [name, text] of help) {
    out.push(`# HELP ${name} ${text}`, `# TYPE ${name} counter`);
    let any = false;
    for (const [key, v] of counters) {
      if (key === name || key.startsWith(name + "{")) {
        out.push(`${key} ${v}`);
        any = true;
      }
    }
    if (!any) out.push(`${name} 0`);
  }
  return out.join("\n") + "\n";
}

export function serve(port: number): void {
  if (!port) return;
  const server = http.createServer((req, res) => {
    if (req.url === "/prom") {
      res.writeHead(200, { "content-type": "text/plain; version=0.0.4" });
      res.end(render());
    } else if (req.url === "/health") {
      res.writeHead(200, { "content-type": "text/plain" });
      res.end("ok\n");
    } else {
      res.writeHead(404);
      res.end();
    }
  });
  server.listen(port, "127.0.0.1");
}

define("tsp_expired_jobs_total", "Jobs that ended ERROR because their TTL ran out before they finished.");
define("tsp_jobs_done_total", "Jobs this process committed DONE.");
define("tsp_jobs_failed_total", "Jobs this process committed ERROR, by code.");
define("tsp_retries_total", "Jobs this process sent back to PENDING after a transient error.");
define("tsp_dead_lettered_total", "Deliveries this process rejected into the dead-letter queue.");
define("tsp_published_total", "Job messages published and confirmed by the broker.");
define("tsp_leases_recovered_total", "Expired leases this process recovered.");
define("tsp_staging_deleted_total", "Orphan staging objects this process deleted.");
