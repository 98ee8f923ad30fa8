/**
 * `@saga-admin/client`: the TypeScript client for Saga Admin, with the Python client's concepts and
 * guarantees. Adapters: `@saga-admin/client/ai` (the Vercel AI SDK) and
 * `@saga-admin/client/openai-agents` (the OpenAI Agents SDK).
 */
export { Saga, currentRun, type RunOptions, type SagaOptions, type SagaTool, type ToolOptions } from "./saga.js";
export {
  Run,
  DONE_STATES,
  type CheckpointOptions,
  type PlanStepOptions,
  type RecordOptions,
  type StepArgs,
  type StepContext,
  type StepOptions,
} from "./run.js";
export {
  ApprovalDeadlinePassed,
  ApprovalPending,
  ApprovalRejected,
  ApprovalTimedOut,
  ApprovalTimeout,
  BeforeImageFailed,
  Conflict,
  InvalidRequest,
  NoActiveRun,
  NotFound,
  Paused,
  PolicyDenied,
  RateLimited,
  RunArchived,
  RunCancelled,
  SagaAPIError,
  SagaAuthError,
  SagaConfigError,
  SagaError,
  SagaUnavailable,
  ServerError,
  StepInDoubt,
  errorFromAnswer,
  rejectionFor,
  type Details,
} from "./errors.js";
export { computeSignature, deriveSecret, signedHeaders, verifySignature, SIGNATURE_HEADER, TIMESTAMP_HEADER, type HeadersLike, type VerifyOptions } from "./signing.js";
export { canonical, stepKey } from "./keys.js";
export { BeforeImages, type PlannedRead, type ReadContext, type Reader } from "./before.js";
export { NoImage, TemplateUnfillable, fillBeforeArgs, imageAt, imagesEqual, readResult, resultOfRead, type BeforeRead } from "./images.js";
export { PolicyCache, policyFor, globRegExp, type ToolPolicy } from "./policies.js";
export { UnretriedFailures } from "./failures.js";
export { API_CODES, CLIENT_CODES, type ApiCode, type ClientCode } from "./generated/codes.js";
export type * from "./types.js";
