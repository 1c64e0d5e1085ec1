/**
 * Warren's layers, checked in lint (`npm run lint:deps`): dependencies point down, never up or sideways, and no
 * package reaches into another's `dist/`, `src/` internals or tests by path. ARCHITECTURE.md draws the same picture.
 *
 *   platform (logger, runMain, env)      imports nothing of Warren's
 *   proto    (every contract)            imports nothing of Warren's
 *   envd, code-gateway, proxy            → proto, platform
 *   control-plane:  api → store, master's contract (proto) ; master → store, node agent's contract (proto)
 *                   node-agent → runtime, templates ; templates → runtime ; runtime → nothing above it
 *   sdk, console                         → proto (types)
 *   local (the cluster launcher)         → proto, platform ; it starts the others as processes
 *   e2e, charts (tests)                  → anything
 */
const COMPONENTS = "(envd|code-gateway|proxy|control-plane|sdk|console|local|e2e|charts)";

module.exports = {
  forbidden: [
    {
      name: "platform-imports-nothing",
      comment: "platform is the bottom layer: every process uses it, it uses none of them",
      severity: "error",
      from: { path: "^platform/" },
      to: { path: `^(proto|${COMPONENTS.slice(1, -1)})/` },
    },
    {
      name: "proto-imports-only-platform",
      comment: "contracts are imported by both sides of a boundary; they import neither",
      severity: "error",
      from: { path: "^proto/" },
      to: { path: `^${COMPONENTS}/` },
    },
    {
      name: "components-stand-alone",
      comment:
        "envd, the code gateway and the proxy talk to the rest over the wire, through proto's contracts; the local launcher starts them as processes",
      severity: "error",
      from: { path: "^(envd|code-gateway|proxy|local)/src/" },
      to: { path: `^${COMPONENTS}/`, pathNot: ["^$1/"] },
    },
    {
      name: "runtime-points-down",
      comment: "the runtime drivers are below the node agent and the template store; a logger or config is passed in",
      severity: "error",
      from: { path: "^control-plane/src/runtime/" },
      to: { path: "^control-plane/src/(api|master|node-agent|templates|store)/" },
    },
    {
      name: "templates-point-down",
      comment: "the node's template store and builder steps use the runtime, never the agent or the control plane",
      severity: "error",
      from: { path: "^control-plane/src/templates/" },
      to: { path: "^control-plane/src/(api|master|node-agent|store)/" },
    },
    {
      name: "node-agent-below-master",
      comment: "the node agent knows the master only through the node agent contract (proto)",
      severity: "error",
      from: { path: "^control-plane/src/node-agent/" },
      to: { path: "^control-plane/src/(api|master|store)/" },
    },
    {
      name: "master-below-api",
      comment: "the master is called by the api over its contract; the node agent is reached over its contract",
      severity: "error",
      from: { path: "^control-plane/src/master/" },
      to: { path: "^control-plane/src/(api|node-agent)/" },
    },
    {
      name: "store-below-api-and-master",
      comment: "the PostgreSQL store serves the api and the master; it knows neither",
      severity: "error",
      from: { path: "^control-plane/src/store/" },
      to: { path: "^control-plane/src/(api|master|node-agent|templates)/" },
    },
    {
      name: "api-reaches-master-by-contract",
      comment: "the api calls the master over master.proto; its logger comes from platform, not the master",
      severity: "error",
      from: { path: "^control-plane/src/api/" },
      to: { path: "^control-plane/src/(master|node-agent|templates)/" },
    },
    {
      name: "sdk-and-console-stand-alone",
      comment: "the SDK and the console ship to users; they speak to Warren over the wire",
      severity: "error",
      from: { path: "^(sdk|console)/src/" },
      to: { path: "^(envd|code-gateway|proxy|control-plane|local|e2e|charts|platform)/" },
    },
    {
      name: "no-other-packages-dist-or-tests",
      comment: "packages import each other by package name (their exports), never another one's build output or tests",
      severity: "error",
      from: { path: "^([^/]+)/" },
      to: { path: "^([^/]+)/(dist|test)/", pathNot: ["^$1/"], dependencyTypes: ["local"] },
    },
    {
      name: "src-never-imports-tests",
      comment: "production code does not depend on test harnesses",
      severity: "error",
      from: { path: "^[^/]+/src/", pathNot: "\\.test\\.ts$" },
      to: { path: "(^[^/]+/test/|\\.test\\.ts$)" },
    },
    {
      name: "no-circular",
      comment:
        "a cycle of runtime imports means two modules are one job, or one is in the wrong layer (a type-only import is erased, and describes the shape of a value passed in)",
      severity: "error",
      from: { path: "^(platform|proto|envd|code-gateway|proxy|control-plane|sdk|local)/src/" },
      to: { circular: true, viaOnly: { dependencyTypesNot: ["type-only"] } },
    },
  ],
  options: {
    // Packages are reached through node_modules (workspace links) and resolve to their dist/: those edges are
    // checked against the rules above but not followed.
    doNotFollow: { path: "(^|/)(node_modules|dist|gen)/" },
    tsPreCompilationDeps: true,
    tsConfig: { fileName: "tsconfig.base.json" },
    enhancedResolveOptions: {
      extensions: [".ts", ".js", ".mjs", ".json"],
      exportsFields: ["exports"],
      conditionNames: ["types", "import", "default"],
      mainFields: ["types", "main"],
    },
  },
};
