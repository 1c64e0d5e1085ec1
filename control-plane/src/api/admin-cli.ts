/**
 * `node control-plane/dist/api/admin-cli.js create-team <name>` → prints `{"team":...,"apiKey":...}` (the key is
 * shown once). `create-key <teamId>` adds a key. Uses DATABASE_URL and WARREN_DB_SCHEMA like the api, and
 * applies migrations first so it works before the master's first start.
 */
import { createDb } from "../store/db.js";
import { migrate } from "../store/migrations.js";
import { createApiKey, createTeam, getTeam } from "../store/teams.js";
import { loadApiConfig } from "./config.js";

const [command, arg] = process.argv.slice(2);
const config = loadApiConfig();
const db = createDb({ url: config.databaseUrl, schema: config.schema, max: 1 });
try {
  await migrate(db, config.schema);
  if (command === "create-team" && arg) {
    const team = await createTeam(db, arg);
    const key = await createApiKey(db, team.id, "default");
    process.stdout.write(`${JSON.stringify({ team, apiKey: { id: key.id, key: key.key } })}\n`);
  } else if (command === "create-key" && arg) {
    if (!(await getTeam(db, arg))) throw new Error(`team '${arg}' not found`);
    const key = await createApiKey(db, arg);
    process.stdout.write(`${JSON.stringify({ id: key.id, key: key.key })}\n`);
  } else {
    process.stderr.write("usage: admin-cli create-team <name> | create-key <teamId>\n");
    process.exitCode = 2;
  }
} catch (error) {
  process.stderr.write(`${error instanceof Error ? error.message : String(error)}\n`);
  process.exitCode = 1;
} finally {
  await db.end();
}
