/**
 * Turns static ES `import` declarations at the start of a line into `var` + `require`,
 * so a cell (a classic script, where `import` is a syntax error) can use them and the
 * bindings outlive the cell like any top-level `var`.
 */
const IMPORT_DECLARATION = /^([ \t]*)import\s+(?:([\w$*\s{},]+?)\s+from\s*)?(["'])([^"'\n]+)\3[ \t]*;?/gm;

export function rewriteImports(code: string): string {
  return code.replace(
    IMPORT_DECLARATION,
    (_match, indent: string, clause: string | undefined, _quote: string, specifier: string) => {
      const source = `require(${JSON.stringify(specifier)})`;
      if (!clause) return `${indent}${source};`;
      return `${indent}${bindings(clause.trim(), source)}`;
    },
  );
}

function bindings(clause: string, source: string): string {
  const declarations: string[] = [];
  let rest = clause;
  const defaultName = /^([\w$]+)\s*(?:,\s*|$)/.exec(rest);
  const module = `__warren_mod_${Math.random().toString(36).slice(2, 8)}`;
  declarations.push(`var ${module} = ${source};`);
  if (defaultName?.[1]) {
    declarations.push(`var ${defaultName[1]} = __warrenDefault(${module});`);
    rest = rest.slice(defaultName[0].length);
  }
  const namespace = /^\*\s*as\s+([\w$]+)/.exec(rest);
  if (namespace?.[1]) declarations.push(`var ${namespace[1]} = ${module};`);
  const named = /^\{([^}]*)\}/.exec(rest);
  if (named?.[1] !== undefined) {
    const parts = named[1]
      .split(",")
      .map((p) => p.trim())
      .filter((p) => p.length > 0)
      .map((p) => p.replace(/^([\w$]+)\s+as\s+([\w$]+)$/, "$1: $2"));
    if (parts.length > 0) declarations.push(`var { ${parts.join(", ")} } = ${module};`);
  }
  return declarations.join(" ");
}
