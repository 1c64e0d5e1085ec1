import { describe, expect, it } from "vitest";
import { driverServes, TEMPLATE_RECIPES } from "./catalog.js";

describe("templates that require a driver", () => {
  const baseVm = TEMPLATE_RECIPES["base-vm"];
  const base = TEMPLATE_RECIPES.base;

  it("base-vm runs only on microVM drivers (microvm, and microvm-tcg in tests); base runs anywhere", () => {
    if (!baseVm || !base) throw new Error("catalog lacks base or base-vm");
    expect(driverServes(baseVm, "microvm")).toBe(true);
    expect(driverServes(baseVm, "microvm-tcg")).toBe(true);
    expect(driverServes(baseVm, "namespace")).toBe(false);
    expect(driverServes(baseVm, "microvmish")).toBe(false);
    for (const driver of ["namespace", "microvm", "microvm-tcg"]) expect(driverServes(base, driver)).toBe(true);
  });
});
