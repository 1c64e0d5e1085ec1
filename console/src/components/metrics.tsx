import { useEffect, useRef, useState } from "preact/hooks";
import uPlot from "uplot";
import type { MetricSample, WarrenApi } from "../api.js";
import { bytes } from "../format.js";
import { Empty, ErrorBox, Loading } from "./common.js";

/** How often the open metrics tab re-reads the stored series (the leader samples on its own interval). */
const REFRESH_MS = 5000;

function Chart(props: {
  title: string;
  samples: MetricSample[];
  value: (m: MetricSample) => number;
  unit: "pct" | "bytes";
}) {
  const host = useRef<HTMLDivElement>(null);
  const plot = useRef<uPlot | undefined>(undefined);
  const { samples, value, unit } = props;
  useEffect(() => {
    const el = host.current;
    if (!el) return;
    const data: uPlot.AlignedData = [samples.map((m) => m.timestampUnix), samples.map(value)];
    if (!plot.current) {
      const stroke = getComputedStyle(el).getPropertyValue("--accent").trim() || "#3b82f6";
      const axis = getComputedStyle(el).getPropertyValue("--fg-muted").trim() || "#888";
      plot.current = new uPlot(
        {
          width: Math.max(240, el.clientWidth),
          height: 160,
          legend: { show: false },
          series: [{}, { label: props.title, stroke, width: 2, fill: `${stroke}22` }],
          axes: [
            { stroke: axis, grid: { stroke: `${axis}33` } },
            {
              stroke: axis,
              grid: { stroke: `${axis}33` },
              size: 70,
              values: (_u, ticks) => ticks.map((t) => (unit === "pct" ? `${t.toFixed(0)}%` : bytes(t))),
            },
          ],
          scales: unit === "pct" ? { y: { range: [0, 100] } } : {},
        },
        data,
        el,
      );
    } else plot.current.setData(data);
  }, [samples, value, unit, props.title]);
  useEffect(() => {
    const el = host.current;
    if (!el) return;
    const observer = new ResizeObserver(() =>
      plot.current?.setSize({ width: Math.max(240, el.clientWidth), height: 160 }),
    );
    observer.observe(el);
    return () => {
      observer.disconnect();
      plot.current?.destroy();
      plot.current = undefined;
    };
  }, []);
  const last = samples.at(-1);
  return (
    <figure class="chart">
      <figcaption>
        {props.title}
        <span class="muted"> {last ? (unit === "pct" ? `${value(last).toFixed(1)}%` : bytes(value(last))) : ""}</span>
      </figcaption>
      <div ref={host} class="chart-canvas" data-testid={`chart-${props.title.toLowerCase()}`} />
    </figure>
  );
}

const cpu = (m: MetricSample) => m.cpuUsedPct;
const memory = (m: MetricSample) => m.memUsed;
const disk = (m: MetricSample) => m.diskUsed;

export function Metrics(props: { api: WarrenApi; sandboxId: string; running: boolean }) {
  const { api, sandboxId, running } = props;
  const [samples, setSamples] = useState<MetricSample[]>();
  const [error, setError] = useState<unknown>();
  useEffect(() => {
    let stopped = false;
    let timer: ReturnType<typeof setTimeout> | undefined;
    const load = async () => {
      try {
        const fresh = await api.metrics(sandboxId);
        if (stopped) return;
        setSamples(fresh);
        setError(undefined);
      } catch (e) {
        if (!stopped) setError(e);
      }
      if (!stopped && running) timer = setTimeout(load, REFRESH_MS);
    };
    void load();
    return () => {
      stopped = true;
      clearTimeout(timer);
    };
  }, [api, sandboxId, running]);

  if (error && !samples) return <ErrorBox error={error} />;
  if (!samples) return <Loading what="metrics" />;
  if (samples.length === 0) {
    return (
      <Empty title="No samples yet.">
        {running
          ? "The first sample arrives within the metrics interval."
          : "The sandbox is paused: nothing is sampled."}
      </Empty>
    );
  }
  return (
    <div class="charts" data-testid="metrics">
      <Chart title="CPU" samples={samples} value={cpu} unit="pct" />
      <Chart title="Memory" samples={samples} value={memory} unit="bytes" />
      <Chart title="Disk" samples={samples} value={disk} unit="bytes" />
    </div>
  );
}
