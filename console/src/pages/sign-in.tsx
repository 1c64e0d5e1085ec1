import { useState } from "preact/hooks";
import { WarrenApi } from "../api.js";
import { messageOf } from "../components/common.js";
import type { Credential } from "../session.js";

/**
 * Sign-in with a team API key or the admin token. The secret is checked with one api call before it is kept;
 * it goes in a header, never in the URL (the form is not submitted by the browser, only read by script).
 */
export function SignIn(props: { onSignedIn: (credential: Credential) => void }) {
  const [kind, setKind] = useState<Credential["kind"]>("apiKey");
  const [secret, setSecret] = useState("");
  const [error, setError] = useState<string>();
  const [checking, setChecking] = useState(false);

  const submit = async (event: Event) => {
    event.preventDefault();
    const credential: Credential = { kind, secret: secret.trim() };
    if (!credential.secret) {
      setError(kind === "apiKey" ? "Enter an API key." : "Enter the admin token.");
      return;
    }
    setChecking(true);
    setError(undefined);
    try {
      const api = new WarrenApi(credential);
      if (kind === "apiKey") await api.request("GET", "/v2/sandboxes?limit=1");
      else await api.nodes();
      props.onSignedIn(credential);
    } catch (e) {
      setError(messageOf(e));
    } finally {
      setChecking(false);
    }
  };

  return (
    <main class="sign-in">
      <form onSubmit={submit} aria-labelledby="sign-in-title" method="post" action="#">
        <h1 id="sign-in-title">Warren console</h1>
        <fieldset>
          <legend>Sign in with</legend>
          <label class="check">
            <input type="radio" name="kind" checked={kind === "apiKey"} onChange={() => setKind("apiKey")} /> A team API
            key
          </label>
          <label class="check">
            <input type="radio" name="kind" checked={kind === "admin"} onChange={() => setKind("admin")} /> The admin
            token (nodes, teams and keys)
          </label>
        </fieldset>
        <label>
          {kind === "apiKey" ? "API key" : "Admin token"}
          <input
            type="password"
            autocomplete="off"
            spellcheck={false}
            autofocus
            value={secret}
            onInput={(e) => setSecret(e.currentTarget.value)}
            data-testid="secret"
          />
        </label>
        {error ? (
          <p class="state state-error" role="alert" data-testid="sign-in-error">
            {error}
          </p>
        ) : null}
        <button type="submit" class="primary" disabled={checking}>
          {checking ? "Checking…" : "Sign in"}
        </button>
        <p class="hint">Kept in this tab only (session storage); closing the tab signs you out.</p>
      </form>
    </main>
  );
}
