/** A failure attributed to a phase (`base`, `1`…`N`, `finalize`), E2B's `reason.step`. */
export class PhaseError extends Error {
  constructor(
    readonly step: string | undefined,
    message: string,
  ) {
    super(message);
    this.name = "PhaseError";
  }
}
