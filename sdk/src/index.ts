export { ApiClient, newIdempotencyKey } from "./api.js";
export {
  type ArtifactFormat,
  type ArtifactInfo,
  type ArtifactPublishOpts,
  Artifacts,
  type ArtifactUrl,
  type ArtifactUrlOpts,
} from "./artifacts.js";
export {
  type Context,
  type CreateCodeContextOpts,
  Execution,
  ExecutionError,
  type Logs,
  type OutputMessage,
  Result,
  type RunCodeLanguage,
  type RunCodeOpts,
} from "./code.js";
export {
  type CommandConnectOpts,
  CommandExitError,
  CommandHandle,
  type CommandRequestOpts,
  type CommandResult,
  type CommandStartOpts,
  type Commands,
  type ProcessInfo,
} from "./commands.js";
export { ConnectionConfig, type ConnectionOpts, type SandboxRouting } from "./config.js";
export {
  ApprovalRequiredError,
  AuthenticationError,
  ExecDeniedError,
  FileNotFoundError,
  InvalidArgumentError,
  NotEnoughSpaceError,
  NotFoundError,
  OutputLostError,
  RateLimitError,
  SandboxError,
  SandboxNotFoundError,
  ServiceBusyError,
  TemplateError,
  TimeoutError,
} from "./errors.js";
export type { SandboxEvent, SandboxEventsOpts } from "./events.js";
export {
  type ApprovalListOpts,
  type ApprovalState,
  type ExecApproval,
  ExecApprovals,
  type ExecPolicy,
  type ExecRule,
} from "./exec-policy.js";
export {
  type EntryInfo,
  type Filesystem,
  type FilesystemEvent,
  FilesystemEventType,
  type FilesystemReadOpts,
  type FilesystemRequestOpts,
  type FilesystemWriteOpts,
  FileType,
  type WatchOpts,
  type WriteEntry,
  type WriteInfo,
} from "./files.js";
export {
  type CommandSecrets,
  createSecretGrant,
  LEASE_HEADER,
  type LeaseInfo,
  type LeaseOpts,
  SECRET_GRANT_HEADER,
} from "./harness.js";
export type { Ports } from "./ports.js";
export { OUTPUT_OFFSET_HEADER, REPLAY_FROM_HEADER, type StreamResilience } from "./process-stream.js";
export type { Pty, PtyConnectOpts, PtyCreateOpts } from "./pty.js";
export { Sandbox, Sandbox as default, type SandboxOpts } from "./sandbox.js";
export type {
  SandboxApiOpts,
  SandboxConnectOpts,
  SandboxCreateOpts,
  SandboxInfo,
  SandboxLifecycle,
  SandboxListOpts,
  SandboxMetrics,
  SandboxNetworkOpts,
  SandboxPaginator,
  SandboxState,
} from "./sandbox-api.js";
export { type FileUrlOpts, getSignature } from "./signature.js";
export type {
  CreateSnapshotOpts,
  SandboxForkOpts,
  SnapshotInfo,
  SnapshotListOpts,
  SnapshotPaginator,
} from "./snapshot-api.js";
export {
  BuildError,
  type BuildInfo,
  type BuildOptions,
  type BuildStatusReason,
  type CallableTemplate,
  type CopyItem,
  type CopyOptions,
  FileUploadError,
  type GetBuildStatusOptions,
  type Instruction,
  type InstructionType,
  LogEntry,
  LogEntryEnd,
  type LogEntryLevel,
  LogEntryStart,
  type McpServerName,
  parseTemplateSpec,
  ReadyCmd,
  type RegistryConfig,
  Template,
  TemplateBase,
  type TemplateBuilder,
  type TemplateBuildStatus,
  type TemplateBuildStatusResponse,
  type TemplateBuildSummary,
  type TemplateClass,
  type TemplateDetail,
  type TemplateFinal,
  type TemplateFromImage,
  type TemplateInfo,
  type TemplateOptions,
  type TemplateSpec,
  type TemplateTag,
  type TemplateTagInfo,
  templateFromJSON,
  waitForFile,
  waitForPort,
  waitForProcess,
  waitForTimeout,
  waitForURL,
} from "./template/index.js";
export type { WatchHandle } from "./watch.js";
