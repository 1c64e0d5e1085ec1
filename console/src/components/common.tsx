import type { ComponentChildren, FunctionComponent } from "preact";
import { useCallback, useEffect, useRef, useState } from "preact/hooks";
import { BASE, navigate } from "../router.js";

/** A link inside the console: a real <a href> (open in new tab works) that navigates without a reload. */
export function Link(props: { href: string; children: ComponentChildren; class?: string; current?: boolean }) {
  return (
    <a
      href={BASE + props.href}
      class={props.class}
      aria-current={props.current ? "page" : undefined}
      onClick={(event) => {
        if (event.button !== 0 || event.metaKey || event.ctrlKey || event.shiftKey || event.altKey) return;
        event.preventDefault();
        navigate(props.href);
      }}
    >
      {props.children}
    </a>
  );
}

export function Loading(props: { what: string }) {
  return (
    <output class="state state-loading" aria-live="polite">
      <span class="spinner" aria-hidden="true" /> Loading {props.what}…
    </output>
  );
}

export function Empty(props: { title: string; children?: ComponentChildren }) {
  return (
    <div class="state state-empty">
      <strong>{props.title}</strong>
      {props.children ? <div>{props.children}</div> : null}
    </div>
  );
}

export function ErrorBox(props: { error: unknown; retry?: () => void }) {
  return (
    <div class="state state-error" role="alert">
      <strong>Something went wrong.</strong> <span class="error-message">{messageOf(props.error)}</span>
      {props.retry ? (
        <button type="button" onClick={props.retry}>
          Retry
        </button>
      ) : null}
    </div>
  );
}

export function messageOf(error: unknown): string {
  if (error instanceof Error) return error.message;
  return String(error);
}

export type Outcome = { readonly ok: boolean; readonly text: string; readonly at: number };

/** The outcome of the last action (success or the api's message), announced to screen readers. */
export function OutcomeBar(props: { outcome: Outcome | undefined }) {
  const outcome = props.outcome;
  if (!outcome) return <div class="outcome outcome-empty" aria-hidden="true" />;
  return (
    <div
      class={`outcome ${outcome.ok ? "outcome-ok" : "outcome-error"}`}
      role={outcome.ok ? "status" : "alert"}
      data-testid="outcome"
    >
      {outcome.text}
    </div>
  );
}

/** Runs an action, recording "done" text or the error's message as the outcome; `busy` while it runs. */
export function useAction(): {
  outcome: Outcome | undefined;
  busy: string | undefined;
  run: (label: string, action: () => Promise<string>) => Promise<void>;
} {
  const [outcome, setOutcome] = useState<Outcome>();
  const [busy, setBusy] = useState<string>();
  const run = useCallback(async (label: string, action: () => Promise<string>) => {
    setBusy(label);
    try {
      const text = await action();
      setOutcome({ ok: true, text, at: Date.now() });
    } catch (error) {
      setOutcome({ ok: false, text: `${label} failed: ${messageOf(error)}`, at: Date.now() });
    } finally {
      setBusy(undefined);
    }
  }, []);
  return { outcome, busy, run };
}

export type Loadable<T> =
  | { readonly status: "loading" }
  | { readonly status: "error"; readonly error: unknown }
  | { readonly status: "ready"; readonly value: T };

/** Loads once per dependency change; `reload` fetches again. Results of a superseded load are dropped. */
export function useLoad<T>(load: () => Promise<T>, deps: unknown[]): [Loadable<T>, () => void] {
  const [state, setState] = useState<Loadable<T>>({ status: "loading" });
  const [generation, setGeneration] = useState(0);
  const latest = useRef(0);
  useEffect(() => {
    const mine = ++latest.current;
    load().then(
      (value) => mine === latest.current && setState({ status: "ready", value }),
      (error) => mine === latest.current && setState({ status: "error", error }),
    );
  }, [...deps, generation]);
  return [state, () => setGeneration((g) => g + 1)];
}

/** A two-step button for destructive actions: the first press asks, the second (within 4 s) does it. */
export function ConfirmButton(props: { label: string; confirm: string; onConfirm: () => void; disabled?: boolean }) {
  const [asking, setAsking] = useState(false);
  useEffect(() => {
    if (!asking) return;
    const timer = setTimeout(() => setAsking(false), 4000);
    return () => clearTimeout(timer);
  }, [asking]);
  return (
    <button
      type="button"
      class={asking ? "danger confirming" : "danger"}
      disabled={props.disabled}
      onClick={() => {
        if (asking) {
          setAsking(false);
          props.onConfirm();
        } else setAsking(true);
      }}
    >
      {asking ? props.confirm : props.label}
    </button>
  );
}

/** A component from a module loaded on first use (its own bundle chunk). */
export function useLazy<P>(load: () => Promise<FunctionComponent<P>>): FunctionComponent<P> | undefined {
  const [component, setComponent] = useState<{ c: FunctionComponent<P> }>();
  useEffect(() => {
    load().then(
      (c) => setComponent({ c }),
      (error: unknown) => setComponent({ c: () => <ErrorBox error={error} /> }),
    );
  }, []);
  return component?.c;
}
