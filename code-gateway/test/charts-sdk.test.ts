import type {
  BarChart,
  BoxAndWhiskerChart,
  ChartTypes,
  LineChart,
  PieChart,
  Sandbox,
  ScatterChart,
  SuperChart,
} from "@e2b/code-interpreter";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { sdkSandbox, startTestGateway, type TestGateway } from "./harness.js";

/** The distinct [typeof x, typeof y] of PointData's points (the SDK's Chart.elements is any[], which erases them). */
const pointKinds = (points: [number | string, number | string][] = []) => [
  ...new Set(points.map(([x, y]) => `${typeof x},${typeof y}`)),
];

// The scenarios of e2b-dev/code-interpreter js/tests/charts, run with the official SDK against a real
// gateway and kernel, asserting what E2B's tests assert: `result.chart` from the `e2b/chart` MIME type.
let gateway: TestGateway;
let sandbox: Sandbox;
beforeAll(async () => {
  gateway = await startTestGateway({ env: { CODE_GATEWAY_START_LANGUAGES: "python" } });
  sandbox = sdkSandbox(gateway);
}, 60_000);
afterAll(async () => {
  await gateway?.stop();
});

async function firstChart<T extends ChartTypes>(code: string): Promise<T> {
  const execution = await sandbox.runCode(code);
  expect(execution.error).toBeUndefined();
  const chart = execution.results[0]?.chart;
  expect(chart).toBeDefined();
  return chart as T;
}

const BOOK_SALES = `
import matplotlib.pyplot as plt

authors = ['Author A', 'Author B', 'Author C', 'Author D']
sales = [100, 200, 300, 400]

plt.figure(figsize=(10, 6))
plt.bar(authors, sales, label='Books Sold', color='blue')
plt.xlabel('Authors')
plt.ylabel('Number of Books Sold')
plt.title('Book Sales by Authors')
plt.tight_layout()
plt.show()
`;

describe("E2B's chart scenarios through the SDK", () => {
  it("bar", async () => {
    const chart = await firstChart<BarChart>(BOOK_SALES);
    expect(chart.type).toBe("bar");
    expect(chart.title).toBe("Book Sales by Authors");
    expect(chart.x_label).toBe("Authors");
    expect(chart.y_label).toBe("Number of Books Sold");
    expect(chart.x_unit).toBeNull();
    expect(chart.y_unit).toBeNull();
    expect(chart.elements).toHaveLength(4);
    expect(chart.elements.map((bar) => bar.value)).toEqual([100, 200, 300, 400]);
    expect(chart.elements.map((bar) => bar.group)).toEqual(Array(4).fill("Books Sold"));
    expect(chart.elements.map((bar) => bar.label)).toEqual(["Author A", "Author B", "Author C", "Author D"]);
  });

  it("box-and-whisker", async () => {
    const chart = await firstChart<BoxAndWhiskerChart>(`
import matplotlib.pyplot as plt
import numpy as np

scores = {
    'Class A': [85, 90, 78, 92, 88],
    'Class B': [95, 89, 76, 91, 84, 87],
    'Class C': [75, 82, 88, 79, 86]
}

fig, ax = plt.subplots(figsize=(10, 6))
ax.set_title('Exam Scores Distribution')
ax.set_xlabel('Class')
ax.set_ylabel('Score')
ax.boxplot(scores.values(), labels=scores.keys(), patch_artist=True)
ax.legend()
plt.tight_layout()
plt.show()
`);
    expect(chart.type).toBe("box_and_whisker");
    expect(chart.title).toBe("Exam Scores Distribution");
    expect(chart.x_label).toBe("Class");
    expect(chart.y_label).toBe("Score");
    expect(chart.x_unit).toBeNull();
    expect(chart.y_unit).toBeNull();
    const boxes = chart.elements;
    expect(boxes).toHaveLength(3);
    expect(boxes.map((box) => box.label)).toEqual(["Class A", "Class B", "Class C"]);
    expect(boxes.map((box) => box.outliers)).toEqual([[], [76], []]);
    expect(boxes.map((box) => box.min)).toEqual([78, 84, 75]);
    expect(boxes.map((box) => box.first_quartile)).toEqual([85, 84.75, 79]);
    expect(boxes.map((box) => box.median)).toEqual([88, 88, 82]);
    expect(boxes.map((box) => box.third_quartile)).toEqual([90, 90.5, 86]);
    expect(boxes.map((box) => box.max)).toEqual([92, 95, 88]);
  });

  it("line", async () => {
    const chart = await firstChart<LineChart>(`
import numpy as np
import matplotlib.pyplot as plt
import datetime

dates = [datetime.date(2023, 9, 1) + datetime.timedelta(seconds=i) for i in range(100)]
x = np.linspace(0, 2*np.pi, 100)

plt.figure(figsize=(10, 6))
plt.plot(dates, np.sin(x), label='sin(x)')
plt.plot(dates, np.cos(x), label='cos(x)')
plt.xlabel("Time (s)")
plt.ylabel("Amplitude (Hz)")
plt.title('Plot of sin(x) and cos(x)')
plt.show()
`);
    expect(chart.type).toBe("line");
    expect(chart.title).toBe("Plot of sin(x) and cos(x)");
    expect(chart.x_label).toBe("Time (s)");
    expect(chart.y_label).toBe("Amplitude (Hz)");
    expect(chart.x_scale).toBe("datetime");
    expect(chart.y_scale).toBe("linear");
    expect(chart.x_unit).toBe("s");
    expect(chart.y_unit).toBe("Hz");
    expect(chart.x_ticks.every((tick) => typeof tick === "string")).toBe(true);
    expect(new Date(chart.x_ticks[0]!)).toBeInstanceOf(Date);
    expect(chart.y_ticks.every((tick) => typeof tick === "number")).toBe(true);
    expect(chart.y_tick_labels.every((label) => typeof label === "string")).toBe(true);
    expect(chart.x_tick_labels.every((label) => typeof label === "string")).toBe(true);
    const [sin, cos, ...rest] = chart.elements;
    expect(rest).toEqual([]);
    for (const [line, label] of [
      [sin, "sin(x)"],
      [cos, "cos(x)"],
    ] as const) {
      expect(line?.label).toBe(label);
      expect(line?.points).toHaveLength(100);
      expect(pointKinds(line?.points)).toEqual(["string,number"]);
    }
    expect(new Date(sin!.points[0]![0])).toEqual(new Date("2023-09-01T00:00:00.000Z"));
  });

  it("log", async () => {
    const chart = await firstChart<LineChart>(`
import numpy as np
import matplotlib.pyplot as plt

x = np.linspace(0, 100, 100)
y = np.exp(x)

plt.figure(figsize=(10, 6))
plt.plot(x, y, label='y = e^x')
plt.yscale('log')
plt.xlabel('X-axis')
plt.ylabel('Y-axis (log scale)')
plt.title('Chart with Log Scale on Y-axis')
plt.legend()
plt.grid(True)
plt.show()
`);
    expect(chart.type).toBe("line");
    expect(chart.title).toBe("Chart with Log Scale on Y-axis");
    expect(chart.x_label).toBe("X-axis");
    expect(chart.y_label).toBe("Y-axis (log scale)");
    expect(chart.x_unit).toBeNull();
    expect(chart.y_unit).toBe("log scale");
    expect(chart.x_scale).toBe("linear");
    expect(chart.y_scale).toBe("log");
    expect(chart.x_ticks.every((x) => typeof x === "number")).toBe(true);
    expect(chart.y_ticks.every((y) => typeof y === "number")).toBe(true);
    expect(chart.x_tick_labels.every((x) => typeof x === "string")).toBe(true);
    expect(chart.y_tick_labels.every((y) => typeof y === "string")).toBe(true);
    expect(chart.elements).toHaveLength(1);
    expect(chart.elements[0]?.label).toBe("y = e^x");
    expect(chart.elements[0]?.points).toHaveLength(100);
    expect(pointKinds(chart.elements[0]?.points)).toEqual(["number,number"]);
  });

  it("pie", async () => {
    const chart = await firstChart<PieChart>(`
import matplotlib.pyplot as plt
import numpy as np

categories = ["No", "No, in blue"]
sizes = [90, 10]

fig, ax = plt.subplots(figsize=(8, 8))
plt.xlabel("x")
plt.ylabel("y")
ax.pie(sizes, labels=categories, autopct='%1.1f%%', startangle=90, colors=plt.cm.Pastel1.colors[:len(categories)])
ax.axis('equal')
plt.title('Will I wake up early tomorrow?')
plt.show()
`);
    expect(chart.type).toBe("pie");
    expect(chart.title).toBe("Will I wake up early tomorrow?");
    expect(chart.elements).toHaveLength(2);
    expect(chart.elements[0]).toEqual({ label: "No", angle: 324, radius: 1 });
    expect(chart.elements[1]).toEqual({ label: "No, in blue", angle: 36, radius: 1 });
  });

  // E2B sends these two cells indented, as written inside its test: IPython strips the indentation.
  it("datetime scale", async () => {
    const chart = await firstChart<LineChart>(`
    import numpy as np
    import matplotlib.pyplot as plt
    import datetime

    dates = [datetime.date(2023, 9, 1) + datetime.timedelta(seconds=i) for i in range(100)]
    y_sin = np.sin(np.linspace(0, 2*np.pi, 100))

    plt.figure(figsize=(10, 6))
    plt.plot(dates, y_sin, label='sin(x)')
    plt.show()
    `);
    expect(chart.type).toBe("line");
    expect(chart.x_scale).toBe("datetime");
    expect(chart.y_scale).toBe("linear");
  });

  it("categorical scale", async () => {
    const chart = await firstChart<LineChart>(`
    import numpy as np
    import matplotlib.pyplot as plt

    plt.figure(figsize=(10, 6))
    plt.plot([1, 2, 3, 4, 5], ['A', 'B', 'C', 'D', 'E'])
    plt.show()
    `);
    expect(chart).toBeTruthy();
    expect(chart.type).toBe("line");
    expect(chart.x_scale).toBe("linear");
    expect(chart.y_scale).toBe("categorical");
  });

  it("scatter", async () => {
    const chart = await firstChart<ScatterChart>(`
import matplotlib.pyplot as plt
import numpy as np

N = 5
plt.xlabel("A")
plt.ylabel("B")
plt.scatter(np.random.rand(N), np.random.rand(N), c='blue', label='Dataset 1')
plt.scatter(np.random.rand(2*N), np.random.rand(2*N), c='red', label='Dataset 2')
plt.show()
`);
    expect(chart.type).toBe("scatter");
    expect(chart.title).toBeNull();
    expect(chart.x_label).toBe("A");
    expect(chart.y_label).toBe("B");
    expect(chart.x_ticks.every((tick) => typeof tick === "number")).toBe(true);
    expect(chart.y_ticks.every((tick) => typeof tick === "number")).toBe(true);
    expect(chart.x_tick_labels.every((label) => typeof label === "string")).toBe(true);
    expect(chart.y_tick_labels.every((label) => typeof label === "string")).toBe(true);
    expect(chart.elements).toHaveLength(2);
    const [first, second] = chart.elements;
    expect(first?.label).toBe("Dataset 1");
    expect(first?.points).toHaveLength(5);
    expect(pointKinds(first?.points)).toEqual(["number,number"]);
    expect(second?.label).toBe("Dataset 2");
    expect(second?.points).toHaveLength(10);
    expect(pointKinds(second?.points)).toEqual(["number,number"]);
  });

  it("superchart", async () => {
    const chart = await firstChart<SuperChart>(`
import matplotlib.pyplot as plt
import numpy as np

x1 = np.linspace(0, 10, 100)
fig, axs = plt.subplots(1, 2, figsize=(10, 8))
fig.suptitle('Multiple Charts Example', fontsize=16)

axs[0].plot(x1, np.sin(x1), 'r')
axs[0].set_title('Sine Wave')
axs[0].grid(True)

axs[1].scatter(np.random.rand(5), np.random.rand(5), c='blue', label='Dataset 1')
axs[1].set_xlabel('X')
axs[1].set_ylabel('Y')
axs[1].set_title('Scatter Plot')
axs[1].grid(True)
plt.show()
`);
    expect(chart.type).toBe("superchart");
    expect(chart.title).toBe("Multiple Charts Example");
    const [first, second, ...rest] = chart.elements as [LineChart, ScatterChart];
    expect(rest).toEqual([]);
    expect(first.title).toBe("Sine Wave");
    expect(first.type).toBe("line");
    expect(first.x_label).toBeNull();
    expect(first.y_label).toBeNull();
    expect(first.elements).toHaveLength(1);
    expect(first.elements[0]?.points).toHaveLength(100);
    expect(second.title).toBe("Scatter Plot");
    expect(second.type).toBe("scatter");
    expect(second.x_label).toBe("X");
    expect(second.y_label).toBe("Y");
    expect(second.elements).toHaveLength(1);
    expect(second.elements[0]?.points).toHaveLength(5);
  });

  it("unknown", async () => {
    const chart = await firstChart(`
import matplotlib.pyplot as plt

fig, ax = plt.subplots()
ax.add_artist(plt.Circle((0, 0), 1, color='blue', fill=False, linewidth=2))
ax.add_artist(plt.Circle((0, 0), 2, color='red', fill=False, linewidth=2))
ax.grid(True)
plt.title('Two Concentric Circles')
plt.show()
`);
    expect(chart.type).toBe("unknown");
    expect(chart.title).toBe("Two Concentric Circles");
    expect(chart.elements).toHaveLength(0);
  });
});

describe("when a chart is sent", () => {
  it("sends it with the figure's PNG for plt.show(), a figure left open at the cell's end and a Figure value", async () => {
    const shown = await sandbox.runCode(BOOK_SALES);
    expect(shown.results).toHaveLength(1);
    expect(shown.results[0]?.png).toBeTruthy();
    expect(shown.results[0]?.extra).toEqual({});
    const leftOpen = await sandbox.runCode("import matplotlib.pyplot as plt\nplt.plot([1, 2], [3, 4])\nNone");
    expect(leftOpen.results.map((r) => [r.isMainResult, r.chart?.type])).toEqual([[false, "line"]]);
    const value = await sandbox.runCode("fig = plt.figure()\nplt.pie([1, 1])\nfig");
    expect(value.results[0]?.isMainResult).toBe(true);
    expect(value.results[0]?.chart).toMatchObject({ type: "pie", elements: [{ angle: 180 }, { angle: 180 }] });
  });

  it("sends no chart for a figure without data (empty axes), and still displays it", async () => {
    const execution = await sandbox.runCode("import matplotlib.pyplot as plt\nplt.subplots()\nplt.show()");
    expect(execution.error).toBeUndefined();
    expect(execution.results).toHaveLength(1);
    expect(execution.results[0]?.png).toBeTruthy();
    expect(execution.results[0]?.chart).toBeUndefined();
  });

  it("keeps sending charts after %matplotlib inline re-registers the figure formatters", async () => {
    const execution = await sandbox.runCode(
      "%matplotlib inline\nimport matplotlib.pyplot as plt\nplt.plot([1, 2]); plt.show()",
    );
    expect(execution.results[0]?.chart?.type).toBe("line");
  });
});
