// One entry point, one command per role: api (with the relay), worker, sweeper, migrate.
// The libuv thread pool (where sharp renders) is sized before any module that uses it loads.
process.env.UV_THREADPOOL_SIZE = process.env.UV_THREADPOOL_SIZE || "8";

async function main(): Promise<void> {
  const role = process.argv[2];
  const { load, log } = await import("./config");
  const failpoints = await import("./failpoints");
  if (!["api", "worker", "sweeper", "migrate"].includes(role || "")) {
    process.stderr.write("usage: node dist/main.js api|worker|sweeper|migrate\n");
    process.exit(2);
  }
  const cfg = load(role);
  failpoints.parse(cfg.faults); // a malformed spec stops the role at start
  process.on("unhandledRejection", (err) => log("unhandled rejection", { error: String(err) }));
  const metrics = await import("./metrics");
  if (role === "migrate") {
    const { pool, migrate } = await import("./db");
    const { connect, declareTopology } = await import("./broker");
    const db = pool(cfg, 1);
    await migrate(db);
    await db.end();
    const conn = await connect(cfg, "migrate");
    const ch = await conn.createChannel();
    await declareTopology(ch);
    await conn.close();
    log("migrated: schema and broker topology declared");
    return;
  }
  if (role === "api") {
    const { runApi } = await import("./api");
    await runApi(cfg);
  } else if (role === "worker") {
    metrics.serve(cfg.metricsPort);
    const { Worker } = await import("./worker");
    await new Worker(cfg).run();
  } else {
    metrics.serve(cfg.metricsPort);
    const { Sweeper } = await import("./sweeper");
    await new Sweeper(cfg).run();
  }
  log(`${role} stopped`);
  process.exit(0);
}

main().catch((err) => {
  process.stderr.write(`fatal: ${err && err.stack ? err.stack : err}\n`);
  process.exit(1);
});
