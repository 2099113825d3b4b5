// Failpoints (docs/CONTRACT.md §7): "name=action;name2=N*action", actions crash, pause(ms), error.
export class FailpointError extends Error {
  constructor(name: string) {
    super(`failpoint ${name}: injected transient error`);
  }
}

interface Armed {
  action: "crash" | "pause" | "error";
  pauseMs: number;
  remaining: number; // Infinity when unbounded
}

const armed = new Map<string, Armed>();

export function parse(spec: string): void {
  armed.clear();
  for (const part of spec.split(";").map((s) => s.trim()).filter((s) => s)) {
    const m = /^([a-z_][a-z0-9_]*)=(?:(\d+)\*)?(crash|error|pause\((\d+)\))$/.exec(part);
    if (!m) throw new Error(`malformed failpoint spec: ${JSON.stringify(part)}`);
    const action = m[3].startsWith("pause") ? "pause" : (m[3] as "crash" | "error");
    armed.set(m[1], { action, pauseMs: m[4] ? Number(m[4]) : 0, remaining: m[2] ? Number(m[2]) : Infinity });
  }
}

export async function hit(name: string): Promise<void> {
  const a = armed.get(name);
  if (!a || a.remaining <= 0) return;
  a.remaining -= 1;
  process.stdout.write(JSON.stringify({ t: new Date().toISOString(), msg: "failpoint hit", name, action: a.action }) + "\n");
  if (a.action === "crash") {
    process.kill(process.pid, "SIGKILL");
    await new Promise(() => undefined);
  } else if (a.action === "pause") {
    await new Promise((r) => setTimeout(r, a.pauseMs));
  } else {
    throw new FailpointError(name);
  }
}
