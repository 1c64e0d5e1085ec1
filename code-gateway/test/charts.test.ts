import { spawn } from "node:child_process";
import { fileURLToPath } from "node:url";
import type {
  BarChart,
  BoxAndWhiskerChart,
  LineChart,
  PieChart,
  ScatterChart,
  SuperChart,
} from "@e2b/code-interpreter";
import { beforeAll, describe, expect, it } from "vitest";

// Unit tests of python/warren_charts.py: each case draws a figure with Debian's matplotlib (Agg, no
// kernel) and the extractor turns it into the `e2b/chart` value. One Python process runs every case.

const PYTHON_DIR = fileURLToPath(new URL("../python/", import.meta.url));

const DRIVER = `
import json, sys
sys.path.insert(0, sys.argv[1])
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
from warren_charts import figure_chart
charts = {}
for name, code in json.load(sys.stdin).items():
    plt.close("all")
    exec(code, {"plt": plt})
    charts[name] = figure_chart(plt.gcf())
json.dump(charts, sys.stdout, allow_nan=False)
`;

/** Python source written indented inside this file, dedented. */
function python(source: string): string {
  const lines = source.replace(/^\n/, "").trimEnd().split("\n");
  const indent = Math.min(...lines.filter((l) => l.trim()).map((l) => l.length - l.trimStart().length));
  return lines.map((l) => l.slice(indent)).join("\n");
}

const CASES: Record<string, string> = {
  bar: python(`
    plt.figure(figsize=(10, 6))
    plt.bar(["Author A", "Author B", "Author C", "Author D"], [100, 200, 300, 400], label="Books Sold")
    plt.xlabel("Authors")
    plt.ylabel("Number of Books Sold")
    plt.title("Book Sales by Authors")
    plt.tight_layout()
  `),
  barh: python(`
    plt.barh(["north", "south", "east"], [5, 5, 7], label="stores")
    plt.xlabel("Count [stores]")
    plt.ylabel("Region")
  `),
  groupedBars: python(`
    import numpy as np
    x = np.arange(3)
    plt.bar(x - 0.2, [1, 2, 3], 0.4, label="2023")
    plt.bar(x + 0.2, [3, 2, 1], 0.4, yerr=[0.1, 0.2, 0.3])
    plt.xticks(x, ["p", "q", "r"])
    plt.axhline(2, color="k")
  `),
  histograms: python(`
    plt.hist([[1, 2, 2, 3], [2, 3, 3, 4]], bins=[1, 2, 3, 4], label=["before", "after"])
  `),
  box: python(`
    data = {"Class A": [85, 90, 78, 92, 88], "Class B": [95, 89, 76, 91, 84, 87], "Class C": [75, 82, 88, 79, 86]}
    fig, ax = plt.subplots(figsize=(10, 6))
    ax.set_title("Exam Scores Distribution")
    ax.set_xlabel("Class")
    ax.set_ylabel("Score")
    ax.boxplot(data.values(), labels=data.keys(), patch_artist=True)
  `),
  horizontalBox: python(`
    data = {"Class A": [85, 90, 78, 92, 88], "Class B": [95, 89, 76, 91, 84, 87], "Class C": [75, 82, 88, 79, 86]}
    fig, ax = plt.subplots()
    ax.set_xlabel("Score (points)")
    ax.set_ylabel("Class")
    ax.boxplot(data.values(), labels=data.keys(), patch_artist=True, vert=False)
  `),
  singleBox: python(`
    plt.boxplot([[1, 2, 3, 4, 5, 6, 40, -30, 50]], patch_artist=True, showmeans=True)
  `),
  pie: python(`
    fig, ax = plt.subplots(figsize=(8, 8))
    ax.pie([90, 10], labels=["No", "No, in blue"], autopct="%1.1f%%", startangle=90)
    ax.axis("equal")
    plt.title("Will I wake up early tomorrow?")
  `),
  datetimeLine: python(`
    import datetime
    import numpy as np
    dates = [datetime.date(2023, 9, 1) + datetime.timedelta(seconds=i) for i in range(100)]
    x = np.linspace(0, 2 * np.pi, 100)
    plt.plot(dates, np.sin(x), label="sin(x)")
    plt.plot(dates, np.cos(x), label="cos(x)")
    plt.xlabel("Time (s)")
    plt.ylabel("Amplitude (Hz)")
    plt.title("Plot of sin(x) and cos(x)")
  `),
  numpyDatetimeLine: python(`
    import numpy as np
    plt.plot(np.array(["2024-03-01T12:00:00", "2024-03-02T12:00:00.5"], dtype="datetime64[ms]"), [1, 2])
  `),
  logLine: python(`
    import numpy as np
    x = np.linspace(0, 100, 100)
    plt.plot(x, np.exp(x), label="y = e^x")
    plt.yscale("log")
    plt.xlabel("X-axis")
    plt.ylabel("Y-axis (log scale)")
    plt.title("Chart with Log Scale on Y-axis")
    plt.legend()
    plt.grid(True)
  `),
  categoricalLine: python(`
    plt.plot([1, 2, 3, 4, 5], ["A", "B", "C", "D", "E"])
  `),
  namedTicks: python(`
    plt.plot([0, 1, 2], [3, 1, 2])
    plt.xticks(range(3), ["mon", "tue", "wed"])
  `),
  lineWithGapsAndReferenceLines: python(`
    import numpy as np
    plt.plot([0, 1, 2, 3], [1, np.nan, 3, np.inf])
    plt.plot([0, 3], [2, 2], label="threshold")
    plt.axhline(1.5)
    plt.axvline(1)
  `),
  errorbarLine: python(`
    plt.errorbar([1, 2, 3], [2, 3, 4], yerr=[0.1, 0.2, 0.3], capsize=3, label="measured")
    plt.plot([1, 3], [2.5, 3.5])
  `),
  scatter: python(`
    import numpy as np
    plt.xlabel("A")
    plt.ylabel("B")
    plt.scatter(np.random.rand(5), np.random.rand(5), c="blue", label="Dataset 1")
    plt.scatter(np.random.rand(10), np.random.rand(10), c="red")
  `),
  scatterDatesAndCategories: python(`
    import datetime
    plt.scatter([datetime.datetime(2024, 1, d, 6) for d in (1, 2, 3)], ["low", "high", "low"], label="s")
  `),
  superchart: python(`
    import numpy as np
    fig, axs = plt.subplots(2, 2, figsize=(10, 8))
    fig.suptitle("Multiple Charts Example", fontsize=16)
    x = np.linspace(0, 10, 100)
    axs[0, 0].plot(x, np.sin(x), "r")
    axs[0, 0].set_title("Sine Wave")
    axs[0, 0].grid(True)
    points = axs[0, 1].scatter(np.random.rand(5), np.random.rand(5), c=np.arange(5), label="Dataset 1")
    axs[0, 1].set_xlabel("X")
    axs[0, 1].set_ylabel("Y")
    axs[0, 1].set_title("Scatter Plot")
    fig.colorbar(points, ax=axs[0, 1])
    axs[1, 0].pie([1, 3])
  `),
  oneOfTwoSubplots: python(`
    fig, (left, right) = plt.subplots(1, 2)
    right.plot([1, 2], [2, 1])
    right.set_title("only", loc="left")
  `),
  unknown: python(`
    fig, ax = plt.subplots()
    ax.add_artist(plt.Circle((0, 0), 1, fill=False))
    ax.add_artist(plt.Circle((0, 0), 2, fill=False))
    ax.grid(True)
    plt.title("Two Concentric Circles")
  `),
  imageAndLine: python(`
    import numpy as np
    plt.imshow(np.eye(3))
    plt.plot([0, 2], [0, 1])
    plt.title("mixed")
  `),
  blank: python(`
    plt.subplots()
  `),
  unreadableAxes: python(`
    fig, ax = plt.subplots()
    ax.plot([1, 2])
    ax.set_title("broken")
    ax.get_xlabel = lambda: 1 / 0
  `),
  pandasTimeSeries: python(`
    import numpy as np
    import pandas as pd
    pd.Series(np.arange(5.0), index=pd.date_range("2023-01-01", periods=5, freq="D"), name="daily").plot()
  `),
};

let charts: Record<string, unknown>;
beforeAll(async () => {
  charts = JSON.parse(await runPython(DRIVER, [PYTHON_DIR], JSON.stringify(CASES)));
}, 60_000);

function runPython(code: string, args: string[], stdin: string): Promise<string> {
  return new Promise((resolve, reject) => {
    const child = spawn("/usr/bin/python3", ["-c", code, ...args], { stdio: ["pipe", "pipe", "pipe"] });
    let stdout = "";
    let stderr = "";
    child.stdout.on("data", (chunk: Buffer) => {
      stdout += chunk.toString();
    });
    child.stderr.on("data", (chunk: Buffer) => {
      stderr += chunk.toString();
    });
    child.once("error", reject);
    child.once("exit", (code) =>
      code === 0 ? resolve(stdout) : reject(new Error(`python exited ${code}: ${stderr}`)),
    );
    child.stdin.end(stdin);
  });
}

const chart = <T>(name: string) => charts[name] as T;
/** The distinct [typeof x, typeof y] of PointData's points (the SDK's Chart.elements is any[], which erases them). */
const pointKinds = (points: [number | string, number | string][] = []) => [
  ...new Set(points.map(([x, y]) => `${typeof x},${typeof y}`)),
];
const isIso = (value: unknown) => typeof value === "string" && !Number.isNaN(Date.parse(value));

describe("bar charts", () => {
  it("gives one element per bar with its category label, group and value (E2B's bar case)", () => {
    expect(chart<BarChart>("bar")).toEqual({
      type: "bar",
      title: "Book Sales by Authors",
      x_label: "Authors",
      y_label: "Number of Books Sold",
      x_unit: null,
      y_unit: null,
      elements: ["Author A", "Author B", "Author C", "Author D"].map((label, i) => ({
        label,
        group: "Books Sold",
        value: (i + 1) * 100,
      })),
    });
  });

  it("reads horizontal bars from the y axis, even with equal values, and names the category axis x", () => {
    const barh = chart<BarChart>("barh");
    expect(barh).toMatchObject({ type: "bar", x_label: "Region", y_label: "Count [stores]", y_unit: "stores" });
    expect(barh.elements).toEqual([
      { label: "north", group: "stores", value: 5 },
      { label: "south", group: "stores", value: 5 },
      { label: "east", group: "stores", value: 7 },
    ]);
  });

  it("labels grouped bars with the tick of their group; error bars and an axhline keep it a bar chart", () => {
    const grouped = chart<BarChart>("groupedBars");
    expect(grouped.type).toBe("bar");
    expect(grouped.elements).toEqual([
      { label: "p", group: "2023", value: 1 },
      { label: "q", group: "2023", value: 2 },
      { label: "r", group: "2023", value: 3 },
      { label: "p", group: "Group 1", value: 3 },
      { label: "q", group: "Group 1", value: 2 },
      { label: "r", group: "Group 1", value: 1 },
    ]);
  });

  it("names histogram groups after hist()'s labels and each bar after its centre", () => {
    expect(chart<BarChart>("histograms").elements).toEqual([
      { label: "1.3", group: "before", value: 1 },
      { label: "2.3", group: "before", value: 2 },
      { label: "3.3", group: "before", value: 1 },
      { label: "1.7", group: "after", value: 0 },
      { label: "2.7", group: "after", value: 1 },
      { label: "3.7", group: "after", value: 3 },
    ]);
  });
});

describe("box-and-whisker charts", () => {
  const exam = [
    { label: "Class A", min: 78, first_quartile: 85, median: 88, third_quartile: 90, max: 92, outliers: [] },
    { label: "Class B", min: 84, first_quartile: 84.75, median: 88, third_quartile: 90.5, max: 95, outliers: [76] },
    { label: "Class C", min: 75, first_quartile: 79, median: 82, third_quartile: 86, max: 88, outliers: [] },
  ];

  it("gives the five numbers and the outliers of each box (E2B's box-and-whisker case)", () => {
    expect(chart<BoxAndWhiskerChart>("box")).toEqual({
      type: "box_and_whisker",
      title: "Exam Scores Distribution",
      x_label: "Class",
      y_label: "Score",
      x_unit: null,
      y_unit: null,
      elements: exam,
    });
  });

  it("reads horizontal boxes the same way, with the category axis named x", () => {
    expect(chart<BoxAndWhiskerChart>("horizontalBox")).toMatchObject({
      x_label: "Class",
      y_label: "Score (points)",
      y_unit: "points",
      elements: exam,
    });
  });

  it("keeps every outlier of a single box and does not take its mean marker for one", () => {
    expect(chart<BoxAndWhiskerChart>("singleBox").elements).toEqual([
      { label: "1", min: 1, first_quartile: 2, median: 4, third_quartile: 6, max: 6, outliers: [-30, 40, 50] },
    ]);
  });
});

describe("pie charts", () => {
  it("gives each slice's label, angle in degrees and radius (E2B's pie case)", () => {
    expect(chart<PieChart>("pie")).toEqual({
      type: "pie",
      title: "Will I wake up early tomorrow?",
      elements: [
        { label: "No", angle: 324, radius: 1 },
        { label: "No, in blue", angle: 36, radius: 1 },
      ],
    });
  });
});

describe("line charts", () => {
  it("gives dates as ISO strings, a datetime x scale and units from the axis labels (E2B's line case)", () => {
    const line = chart<LineChart>("datetimeLine");
    expect(line).toMatchObject({
      type: "line",
      title: "Plot of sin(x) and cos(x)",
      x_label: "Time (s)",
      y_label: "Amplitude (Hz)",
      x_unit: "s",
      y_unit: "Hz",
      x_scale: "datetime",
      y_scale: "linear",
    });
    expect(line.x_ticks.length).toBeGreaterThan(1);
    expect(line.x_ticks.every(isIso)).toBe(true);
    expect(line.y_ticks.every((tick) => typeof tick === "number")).toBe(true);
    expect(line.x_tick_labels).toHaveLength(line.x_ticks.length);
    expect(line.elements.map((e) => [e.label, e.points.length])).toEqual([
      ["sin(x)", 100],
      ["cos(x)", 100],
    ]);
    expect(new Date(line.elements[0]!.points[0]![0])).toEqual(new Date("2023-09-01T00:00:00.000Z"));
    expect(pointKinds(line.elements[0]!.points)).toEqual(["string,number"]);
  });

  it("gives numpy datetime64 points to the second, or finer when they have fractions", () => {
    expect(chart<LineChart>("numpyDatetimeLine").elements[0]!.points).toEqual([
      ["2024-03-01T12:00:00", 1],
      ["2024-03-02T12:00:00.500000", 2],
    ]);
  });

  it("reports a log scale and only the ticks inside the view limits (E2B's log case)", () => {
    const line = chart<LineChart>("logLine");
    expect(line).toMatchObject({ y_scale: "log", x_scale: "linear", x_unit: null, y_unit: "log scale" });
    expect(line.elements).toHaveLength(1);
    expect(line.elements[0]!.label).toBe("y = e^x");
    expect(line.elements[0]!.points).toHaveLength(100);
    // The locator also proposes 1e-9, 1e-3 and 1e51, 1e57, outside the view limits.
    expect(line.y_ticks).toEqual([1e3, 1e9, 1e15, 1e21, 1e27, 1e33, 1e39, 1e45]);
    expect(line.y_tick_labels).toHaveLength(8);
    expect(line.x_ticks).toEqual([0, 20, 40, 60, 80, 100]);
  });

  it("reports string values as a categorical scale (E2B's categorical case), and named integer ticks too", () => {
    const line = chart<LineChart>("categoricalLine");
    expect(line).toMatchObject({ x_scale: "linear", y_scale: "categorical" });
    expect(line.y_ticks).toEqual([0, 1, 2, 3, 4]);
    expect(line.y_tick_labels).toEqual(["A", "B", "C", "D", "E"]);
    expect(line.elements[0]!.points[0]).toEqual([1, "A"]);
    expect(line.elements[0]!.label).toBe("Line 0");
    expect(chart<LineChart>("namedTicks")).toMatchObject({
      x_scale: "categorical",
      x_tick_labels: ["mon", "tue", "wed"],
    });
  });

  it("turns NaN and infinities into null and leaves axhline/axvline out of the elements", () => {
    const line = chart<LineChart>("lineWithGapsAndReferenceLines");
    expect(line.elements).toEqual([
      {
        label: "Line 0",
        points: [
          [0, 1],
          [1, null],
          [2, 3],
          [3, null],
        ],
      },
      {
        label: "threshold",
        points: [
          [0, 2],
          [3, 2],
        ],
      },
    ]);
  });

  it("keeps the data line of errorbar() under the errorbar's label, without its caps and bars", () => {
    expect(chart<LineChart>("errorbarLine").elements).toEqual([
      {
        label: "measured",
        points: [
          [1, 2],
          [2, 3],
          [3, 4],
        ],
      },
      {
        label: "Line 1",
        points: [
          [1, 2.5],
          [3, 3.5],
        ],
      },
    ]);
  });

  it("gives pandas time series (plotted in period ordinals) ISO dates", () => {
    const line = chart<LineChart>("pandasTimeSeries");
    expect(line.x_scale).toBe("datetime");
    expect(line.x_ticks[0]).toBe("2023-01-01T00:00:00");
    expect(line.elements[0]).toMatchObject({ label: "daily" });
    expect(line.elements[0]!.points[4]).toEqual(["2023-01-05T00:00:00", 4]);
  });
});

describe("scatter charts", () => {
  it("gives the points of each collection (E2B's scatter case), naming an unlabelled one", () => {
    const scatter = chart<ScatterChart>("scatter");
    expect(scatter).toMatchObject({ type: "scatter", title: null, x_label: "A", y_label: "B" });
    expect(scatter).toMatchObject({ x_scale: "linear", y_scale: "linear" });
    expect([...scatter.x_ticks, ...scatter.y_ticks].every((tick) => typeof tick === "number")).toBe(true);
    expect(scatter.elements.map((e) => [e.label, e.points.length])).toEqual([
      ["Dataset 1", 5],
      ["Scatter 1", 10],
    ]);
    expect(scatter.elements.flatMap((e) => e.points.flat()).every((v) => typeof v === "number")).toBe(true);
  });

  it("maps points on date and category axes back to ISO dates and category names", () => {
    const scatter = chart<ScatterChart>("scatterDatesAndCategories");
    expect(scatter).toMatchObject({ x_scale: "datetime", y_scale: "categorical", y_tick_labels: ["low", "high"] });
    expect(scatter.elements[0]!.points).toEqual([
      ["2024-01-01T06:00:00+00:00", "low"],
      ["2024-01-02T06:00:00+00:00", "high"],
      ["2024-01-03T06:00:00+00:00", "low"],
    ]);
  });
});

describe("figures with several charts, unknown and blank figures", () => {
  it("makes a superchart of the subplots with data, without empty subplots and colorbars (E2B's case)", () => {
    const superchart = chart<SuperChart>("superchart");
    expect(superchart.type).toBe("superchart");
    expect(superchart.title).toBe("Multiple Charts Example");
    const [line, scatter, pie, ...rest] = superchart.elements as [LineChart, ScatterChart, PieChart];
    expect(rest).toEqual([]);
    expect(line).toMatchObject({ type: "line", title: "Sine Wave", x_label: null, y_label: null });
    expect(line.elements[0]!.points).toHaveLength(100);
    expect(scatter).toMatchObject({ type: "scatter", title: "Scatter Plot", x_label: "X", y_label: "Y" });
    expect(scatter.elements[0]!.points).toHaveLength(5);
    expect(pie.elements.map((e) => e.angle)).toEqual([90, 270]);
  });

  it("gives the one chart of a figure whose other subplot is empty, titled from a left title", () => {
    expect(chart<LineChart>("oneOfTwoSubplots")).toMatchObject({ type: "line", title: "only" });
  });

  it("reports artists of no chart kind as unknown with the title (E2B's unknown case)", () => {
    expect(chart("unknown")).toEqual({ type: "unknown", title: "Two Concentric Circles", elements: [] });
    expect(chart("imageAndLine")).toEqual({ type: "unknown", title: "mixed", elements: [] });
  });

  it("gives no chart for a blank figure, and an unknown one for axes it cannot read", () => {
    expect(chart("blank")).toBeNull();
    expect(chart("unreadableAxes")).toEqual({ type: "unknown", title: "broken", elements: [] });
  });
});
