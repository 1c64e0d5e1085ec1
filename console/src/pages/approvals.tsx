import { useEffect, useState } from "preact/hooks";
import { ApiError, type ExecApproval, type ExecPolicy, type WarrenApi } from "../api.js";
import { approvalBoard, requestSummary, ruleMatches } from "../approvals.js";
import {
  ConfirmButton,
  Empty,
  ErrorBox,
  Link,
  Loading,
  messageOf,
  OutcomeBar,
  useAction,
  useLoad,
} from "../components/common.js";
import { shortDuration } from "../format.js";
import type { LiveApprovalsState } from "../live-approvals.js";
import { useNow } from "./sandboxes.js";

type Run = ReturnType<typeof useAction>["run"];
/** undefined while asking; `true` for an approver key, else the api's 403 message. */
type Approver = true | { readonly message: string } | undefined;

const EXAMPLE_POLICY: ExecPolicy = {
  rules: [
    { name: "destructive", command: "rm -rf *", action: "review" },
    { name: "no curl", command: "curl *", action: "deny" },
    { name: "etc", paths: ["/etc"], ops: ["write", "remove"], action: "review" },
  ],
  default: "allow",
  reviewTtlSeconds: 3600,
};

function Ago(props: { iso: string; now: number }) {
  return (
    <time dateTime={props.iso} title={new Date(props.iso).toLocaleString()}>
      {shortDuration(props.now - new Date(props.iso).getTime())} ago
    </time>
  );
}

function RequestCell(props: { approval: ExecApproval }) {
  const { approval } = props;
  const env = approval.request.envNames ?? [];
  return (
    <td>
      {approval.kind !== "start" ? <span class="chip">file {approval.kind}</span> : null}
      <code class="mono request" data-testid="approval-request">
        {requestSummary(approval)}
      </code>
      {env.length > 0 ? <div class="muted">env: {env.join(", ")}</div> : null}
    </td>
  );
}

function SandboxCell(props: { id: string }) {
  return (
    <td>
      <Link href={`/sandboxes/${props.id}`} class="mono">
        {props.id}
      </Link>
    </td>
  );
}

function PendingRow(props: {
  api: WarrenApi;
  approval: ExecApproval;
  now: number;
  canDecide: boolean;
  busy: string | undefined;
  run: Run;
  onDecided: () => void;
}) {
  const { api, approval: a, run } = props;
  const [reason, setReason] = useState("");
  const decide = (verdict: "approve" | "reject") =>
    void run(verdict === "approve" ? "Approve" : "Reject", async () => {
      const decided = await api.decide(a.approvalID, verdict, reason.trim());
      props.onDecided();
      return `${decided.state === "approved" ? "Approved" : "Rejected"} ${a.approvalID}`;
    });
  return (
    <tr data-approval-id={a.approvalID}>
      <RequestCell approval={a} />
      <td class="mono">{a.request.user}</td>
      <td class="mono">{a.request.cwd ?? "-"}</td>
      <SandboxCell id={a.sandboxID} />
      <td>{a.rule}</td>
      <td>
        <Ago iso={a.requestedAt} now={props.now} />
      </td>
      <td data-testid="expires-in">{shortDuration(new Date(a.expiresAt).getTime() - props.now)}</td>
      <td>
        {props.canDecide ? (
          <div class="actions">
            <input
              aria-label={`Reason for ${a.approvalID}`}
              placeholder="reason (optional)"
              maxLength={1024}
              value={reason}
              onInput={(e) => setReason(e.currentTarget.value)}
            />
            <button type="button" class="primary" disabled={props.busy !== undefined} onClick={() => decide("approve")}>
              Approve
            </button>
            <button type="button" class="danger" disabled={props.busy !== undefined} onClick={() => decide("reject")}>
              Reject
            </button>
          </div>
        ) : (
          <span class="muted">an approver key decides</span>
        )}
      </td>
    </tr>
  );
}

function DecidedRow(props: { approval: ExecApproval; now: number }) {
  const { approval: a, now } = props;
  return (
    <tr data-approval-id={a.approvalID}>
      <RequestCell approval={a} />
      <td class="mono">{a.request.user}</td>
      <SandboxCell id={a.sandboxID} />
      <td>{a.rule}</td>
      <td>
        <span class={`badge badge-${a.state}`} data-testid="approval-state">
          {a.state}
        </span>
      </td>
      <td>
        {a.decidedAt ? <Ago iso={a.decidedAt} now={now} /> : "-"}
        {a.decidedBy ? <div class="mono muted">{a.decidedBy}</div> : null}
      </td>
      <td>{a.reason ?? <span class="muted">-</span>}</td>
    </tr>
  );
}

function PolicyRules(props: { policy: ExecPolicy }) {
  const { policy } = props;
  return (
    <>
      {policy.rules.length === 0 ? (
        <Empty title="The policy has no rules." />
      ) : (
        <table class="table" data-testid="policy-rules">
          <thead>
            <tr>
              <th scope="col">#</th>
              <th scope="col">Name</th>
              <th scope="col">Action</th>
              <th scope="col">Matches</th>
            </tr>
          </thead>
          <tbody>
            {policy.rules.map((rule, i) => (
              <tr key={i}>
                <td>{i + 1}</td>
                <td>{rule.name ?? <span class="muted">rule {i + 1}</span>}</td>
                <td>
                  <span class={`badge badge-${rule.action}`}>{rule.action}</span>
                </td>
                <td class="mono">{ruleMatches(rule)}</td>
              </tr>
            ))}
          </tbody>
        </table>
      )}
      <p class="hint">
        Rules are tried in order; the first that matches decides. Nothing matched:{" "}
        <strong>{policy.default ?? "allow"}</strong>. A review waits{" "}
        {shortDuration((policy.reviewTtlSeconds ?? 3600) * 1000)} for a decision, and an approval as long for its use.
      </p>
    </>
  );
}

/** The team's exec policy: a table for every key; an editor (JSON) and Clear for an approver key. */
function PolicyPanel(props: { api: WarrenApi; approver: Approver; busy: string | undefined; run: Run }) {
  const { api, run } = props;
  const [policy, reload] = useLoad(() => api.execPolicy(), [api]);
  const [draft, setDraft] = useState<string>();
  const [draftError, setDraftError] = useState<string>();
  const current = policy.status === "ready" ? policy.value : undefined;

  const save = (text: string) =>
    void run("Save policy", async () => {
      let parsed: unknown;
      try {
        parsed = JSON.parse(text);
      } catch (error) {
        setDraftError(`not JSON: ${messageOf(error)}`);
        throw new Error("the policy is not JSON");
      }
      try {
        await api.setExecPolicy(parsed);
      } catch (error) {
        if (error instanceof ApiError && error.status === 400) setDraftError(error.message);
        throw error;
      }
      setDraft(undefined);
      setDraftError(undefined);
      reload();
      return "Saved the exec policy";
    });

  return (
    <section aria-labelledby="policy-title" class="policy">
      <header class="page-header">
        <h2 id="policy-title">Exec policy</h2>
        {props.approver === true && draft === undefined && policy.status === "ready" ? (
          <div class="actions">
            <button
              type="button"
              onClick={() => {
                setDraftError(undefined);
                setDraft(JSON.stringify(current ?? EXAMPLE_POLICY, null, 2));
              }}
            >
              {current ? "Edit policy" : "Set a policy"}
            </button>
            {current ? (
              <ConfirmButton
                label="Clear policy"
                confirm="Confirm clear"
                disabled={props.busy !== undefined}
                onConfirm={() =>
                  void run("Clear policy", async () => {
                    await api.clearExecPolicy();
                    reload();
                    return "Cleared the exec policy: every command and file write runs";
                  })
                }
              />
            ) : null}
          </div>
        ) : null}
      </header>
      {draft !== undefined ? (
        <form
          class="policy-editor"
          onSubmit={(e) => {
            e.preventDefault();
            save(draft);
          }}
        >
          <label>
            Policy (JSON: rules, default, reviewTtlSeconds)
            <textarea
              data-testid="policy-json"
              spellcheck={false}
              rows={Math.min(24, Math.max(8, draft.split("\n").length + 1))}
              value={draft}
              aria-invalid={draftError ? true : undefined}
              aria-describedby={draftError ? "policy-error" : undefined}
              onInput={(e) => setDraft(e.currentTarget.value)}
            />
          </label>
          {draftError ? (
            <p id="policy-error" class="field-error" role="alert" data-testid="policy-error">
              {draftError}
            </p>
          ) : null}
          <div class="actions">
            <button type="submit" class="primary" disabled={props.busy !== undefined}>
              Save policy
            </button>
            <button type="button" onClick={() => setDraft(undefined)}>
              Cancel
            </button>
          </div>
        </form>
      ) : null}
      {policy.status === "loading" ? (
        <Loading what="the exec policy" />
      ) : policy.status === "error" ? (
        <ErrorBox error={policy.error} retry={reload} />
      ) : policy.value === null ? (
        <Empty title="This team has no exec policy.">Every command and file write runs, as in E2B.</Empty>
      ) : (
        <PolicyRules policy={policy.value} />
      )}
    </section>
  );
}

/**
 * Requests the team's exec policy held back for review, pending first, with Approve and Reject for an approver
 * key; then the decided ones; then the policy itself. The lists follow the ledger (`live`, shared with the nav's
 * pending count).
 */
export function ApprovalsPage(props: { api: WarrenApi; live: LiveApprovalsState }) {
  const { api, live } = props;
  const now = useNow();
  const { outcome, busy, run } = useAction();
  const [approver, setApprover] = useState<Approver>();

  useEffect(() => {
    let stopped = false;
    api.notApproverReason().then(
      (message) => !stopped && setApprover(message === undefined ? true : { message }),
      // Unknown: the buttons stay, and a refusal shows the api's message in the outcome.
      () => !stopped && setApprover(true),
    );
    return () => {
      stopped = true;
    };
  }, [api]);

  const board = live.lists ? approvalBoard(live.lists.pending, live.lists.recent, now) : undefined;
  return (
    <section aria-labelledby="approvals-title">
      <header class="page-header">
        <h1 id="approvals-title">Approvals</h1>
        <span class={`live live-${live.status}`} data-testid="approvals-live">
          {live.status === "live" ? "Live" : live.status === "connecting" ? "Connecting…" : "Reconnecting…"}
        </span>
        <button type="button" onClick={live.reload}>
          Refresh
        </button>
      </header>
      <p class="hint">
        Commands and file writes an exec policy's <code>review</code> rule held back. An approved request runs once,
        exactly as requested, when the client sends it again with the approval id (official SDK: the{" "}
        <code>WARREN_APPROVAL_ID</code> env var; Warren's SDK: <code>{"{ approval: id }"}</code>).
      </p>
      {approver !== undefined && approver !== true ? (
        <p class="notice" role="note" data-testid="not-approver">
          <strong>This API key is not an approver:</strong> it sees requests and the policy but cannot decide or change
          them. The api says: “{approver.message}”. An admin creates approver keys (
          <code>warren key create --team T --approver</code>).
        </p>
      ) : null}
      <OutcomeBar outcome={outcome} />
      <h2 id="pending-title">Pending{board ? <span class="count-inline"> ({board.pending.length})</span> : null}</h2>
      {live.error && !board ? (
        <ErrorBox error={live.error} retry={live.reload} />
      ) : !board ? (
        <Loading what="approvals" />
      ) : (
        <>
          {live.error ? <ErrorBox error={live.error} retry={live.reload} /> : null}
          {board.pending.length === 0 ? (
            <Empty title="No request is waiting for a decision.">
              A command or file write that matches a review rule appears here as soon as it is held back.
            </Empty>
          ) : (
            <table class="table" data-testid="pending-approvals" aria-labelledby="pending-title">
              <thead>
                <tr>
                  <th scope="col">Request</th>
                  <th scope="col">User</th>
                  <th scope="col">Cwd</th>
                  <th scope="col">Sandbox</th>
                  <th scope="col">Rule</th>
                  <th scope="col">Requested</th>
                  <th scope="col">Expires in</th>
                  <th scope="col">Decision</th>
                </tr>
              </thead>
              <tbody>
                {board.pending.map((a) => (
                  <PendingRow
                    key={a.approvalID}
                    api={api}
                    approval={a}
                    now={now}
                    canDecide={approver === true}
                    busy={busy}
                    run={run}
                    onDecided={live.refresh}
                  />
                ))}
              </tbody>
            </table>
          )}
          <h2 id="decided-title">Decided</h2>
          {board.decided.length === 0 ? (
            <Empty title="Nothing decided yet." />
          ) : (
            <table class="table" data-testid="decided-approvals" aria-labelledby="decided-title">
              <thead>
                <tr>
                  <th scope="col">Request</th>
                  <th scope="col">User</th>
                  <th scope="col">Sandbox</th>
                  <th scope="col">Rule</th>
                  <th scope="col">State</th>
                  <th scope="col">Decided</th>
                  <th scope="col">Reason</th>
                </tr>
              </thead>
              <tbody>
                {board.decided.map((a) => (
                  <DecidedRow key={a.approvalID} approval={a} now={now} />
                ))}
              </tbody>
            </table>
          )}
        </>
      )}
      <PolicyPanel api={api} approver={approver} busy={busy} run={run} />
    </section>
  );
}
