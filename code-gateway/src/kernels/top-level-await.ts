import { type Node, type Pattern, parse, type Statement } from "acorn";

/**
 * Makes a cell that uses top-level `await` runnable as a classic script, the way Node's REPL
 * does: the body moves into an async function whose promise is the cell's completion value;
 * top-level declarations become assignments (so the names land on the global object and
 * outlive the cell, as they would in a script); a final expression statement is returned.
 * Returns undefined when the code does not parse even with top-level await allowed.
 */
export function wrapTopLevelAwait(code: string): string | undefined {
  let body: Statement[];
  try {
    body = parse(code, { ecmaVersion: "latest", sourceType: "script", allowAwaitOutsideFunction: true })
      .body as Statement[];
  } catch {
    return undefined;
  }
  const source = (node: Node) => code.slice(node.start, node.end);
  const edits: { start: number; end: number; text: string }[] = [];
  body.forEach((statement, index) => {
    const last = index === body.length - 1;
    switch (statement.type) {
      case "VariableDeclaration": {
        const assignments = statement.declarations
          .filter((d) => d.init)
          .map((d) => `${source(d.id)} = ${source(d.init as Node)}`);
        // A declaration without initialiser still creates the name (as undefined).
        const bare = statement.declarations.filter((d) => !d.init).flatMap((d) => boundNames(d.id));
        const parts = [...assignments, ...bare.map((name) => `${name} = undefined`)];
        edits.push({ start: statement.start, end: statement.end, text: `void (${parts.join(", ")});` });
        break;
      }
      case "FunctionDeclaration":
      case "ClassDeclaration":
        if (statement.id) {
          edits.push({
            start: statement.start,
            end: statement.end,
            text: `${statement.id.name} = ${source(statement)};`,
          });
        }
        break;
      case "ExpressionStatement":
        if (last) {
          edits.push({ start: statement.start, end: statement.end, text: `return (${source(statement.expression)});` });
        }
        break;
    }
  });
  let rewritten = code;
  for (const edit of edits.reverse()) {
    rewritten = rewritten.slice(0, edit.start) + edit.text + rewritten.slice(edit.end);
  }
  return `(async () => {\n${rewritten}\n})()`;
}

function boundNames(pattern: Pattern): string[] {
  switch (pattern.type) {
    case "Identifier":
      return [pattern.name];
    case "ObjectPattern":
      return pattern.properties.flatMap((p) => boundNames(p.type === "RestElement" ? p.argument : p.value));
    case "ArrayPattern":
      return pattern.elements.flatMap((e) => (e ? boundNames(e) : []));
    case "RestElement":
      return boundNames(pattern.argument);
    case "AssignmentPattern":
      return boundNames(pattern.left);
    default:
      return [];
  }
}
