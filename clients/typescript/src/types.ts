/**
 * The API's shapes, named: every one is a schema of the committed OpenAPI document
 * (`clients/spec/openapi.json`), generated into `generated/openapi.ts` by openapi-typescript.
 */
import type { components, paths } from "./generated/openapi.js";

type Schemas = components["schemas"];

export type { components, paths };
export type Run = Schemas["RunOut"];
export type RunDetail = Schemas["RunDetailOut"];
export type RunPage = Schemas["RunPageOut"];
export type RunFail = Schemas["RunFailOut"];
export type RunStatus = Run["status"];
export type Action = Schemas["ActionOut"];
export type ActionPage = Schemas["ActionPageOut"];
export type ActionVerify = Schemas["ActionVerifyOut"];
export type Plan = Schemas["ActionPlanOut"];
export type Approval = Schemas["ApprovalSummaryOut"];
export type Command = Schemas["CommandOut"];
export type Checkpoint = Schemas["CheckpointOut"];
export type Trail = Schemas["TrailOut"];
export type Policies = Schemas["PoliciesOut"];
export type RunCreate = Schemas["RunIn"];
export type CheckpointCreate = Schemas["CheckpointIn"];
export type ErrorBody = Schemas["ErrorOut"];

/** What a step acts on: `[type, id]`, e.g. `["user", "ashu@company.com"]`. */
export type Target = readonly [string, string];
/** What undoes a step: `[tool, args]`, e.g. `["hr.delete_user", {email}]`. */
export type Compensation = readonly [string, object];
