export { BuildError, FileUploadError, TemplateError } from "./errors.js";
export { LogEntry, LogEntryEnd, type LogEntryLevel, LogEntryStart } from "./logs.js";
export { ReadyCmd, waitForFile, waitForPort, waitForProcess, waitForTimeout, waitForURL } from "./ready-cmd.js";
export { type CallableTemplate, Template, TemplateBase } from "./template.js";
export type { TemplateBuildSummary, TemplateDetail, TemplateInfo } from "./template-api.js";
export { parseTemplateSpec, templateFromJSON } from "./template-file.js";
export type {
  BuildInfo,
  BuildOptions,
  BuildStatusReason,
  CopyItem,
  CopyOptions,
  GetBuildStatusOptions,
  Instruction,
  InstructionType,
  McpServerName,
  RegistryConfig,
  TemplateBuilder,
  TemplateBuildStatus,
  TemplateBuildStatusResponse,
  TemplateClass,
  TemplateFinal,
  TemplateFromImage,
  TemplateOptions,
  TemplateSpec,
  TemplateTag,
  TemplateTagInfo,
} from "./types.js";
