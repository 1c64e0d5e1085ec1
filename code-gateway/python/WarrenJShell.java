import java.io.BufferedReader;
import java.io.FileInputStream;
import java.io.FileOutputStream;
import java.io.InputStream;
import java.io.InputStreamReader;
import java.io.OutputStream;
import java.io.PrintStream;
import java.lang.reflect.Field;
import java.lang.reflect.InvocationTargetException;
import java.lang.reflect.Method;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.Base64;
import java.util.List;
import java.util.Locale;
import java.util.Map;
import java.util.concurrent.BlockingQueue;
import java.util.concurrent.LinkedBlockingQueue;
import jdk.jshell.Diag;
import jdk.jshell.EvalException;
import jdk.jshell.JShell;
import jdk.jshell.JShellException;
import jdk.jshell.Snippet;
import jdk.jshell.SnippetEvent;
import jdk.jshell.SourceCodeAnalysis;
import jdk.jshell.UnresolvedReferenceException;
import jdk.jshell.execution.DirectExecutionControl;
import jdk.jshell.spi.ExecutionControl;
import jdk.jshell.spi.ExecutionControlProvider;
import jdk.jshell.spi.ExecutionEnv;

/**
 * The Java half of Warren's jshell kernel (jshell_kernel.py is the Jupyter half). Runs cells with the JDK's
 * jdk.jshell API in this JVM (no second JVM for execution: half the memory, and the cell's value is the real
 * object, shown with toString() the way IJava, E2B's Java kernel, shows it).
 *
 * Protocol, one line each way over two pipes (fds given as arguments; fds 0-2 are the kernel's, so a
 * subprocess started with inheritIO() cannot corrupt the protocol): requests are `eval <b64 code>`, `setenv <b64 name> <b64 value>`,
 * `unsetenv <b64 name>` (each answered by events then `{"t":"done"}`) and `stop` (interrupts the running cell,
 * no answer). Events are JSON objects: stdout/stderr text, the cell's result, an error.
 */
public class WarrenJShell {
    /** Events go to their own pipe (fd named by args[1]): a subprocess with inheritIO() writes to fd 1. */
    private static PrintStream protocol;

    private static final class Stop {}

    public static void main(String[] args) throws Exception {
        protocol = new PrintStream(new FileOutputStream("/dev/fd/" + Integer.parseInt(args[1])), false,
                StandardCharsets.UTF_8);
        System.setOut(new PrintStream(new EventStream("stdout"), true, StandardCharsets.UTF_8));
        System.setErr(new PrintStream(new EventStream("stderr"), true, StandardCharsets.UTF_8));
        System.setIn(InputStream.nullInputStream());

        CellControl control = new CellControl();
        JShell shell = JShell.builder()
                .executionEngine(new CellControlProvider(control), Map.of())
                .build();
        Cells cells = new Cells(shell, control);
        cells.eval("0", false); // javac's first compilation is the slow one: pay it before saying ready

        BlockingQueue<Object> requests = new LinkedBlockingQueue<>();
        String requestPipe = "/dev/fd/" + Integer.parseInt(args[0]);
        Thread reader = new Thread(() -> readRequests(requestPipe, requests, control), "warren-requests");
        reader.setDaemon(true);
        reader.start();
        send("{\"t\":\"ready\"}");
        while (true) {
            Object request = requests.take();
            if (request instanceof Stop) break;
            String[] parts = ((String) request).split(" ", -1);
            try {
                switch (parts[0]) {
                    case "eval" -> cells.eval(decode(parts[1]), true);
                    case "setenv" -> Environment.set(decode(parts[1]), decode(parts[2]));
                    case "unsetenv" -> Environment.unset(decode(parts[1]));
                    default -> sendError("ProtocolError", "unknown request " + parts[0], List.of());
                }
            } catch (RuntimeException | LinkageError e) {
                sendError(e.getClass().getSimpleName(), String.valueOf(e.getMessage()), List.of(e.toString()));
            }
            System.out.flush();
            System.err.flush();
            send("{\"t\":\"done\"}");
        }
        shell.close();
        System.exit(0);
    }

    /** `stop` is handled at once (the main thread is busy with the cell); the rest queue up in order. */
    private static void readRequests(String pipe, BlockingQueue<Object> requests, CellControl control) {
        try (BufferedReader in = new BufferedReader(new InputStreamReader(new FileInputStream(pipe),
                StandardCharsets.UTF_8))) {
            String line;
            while ((line = in.readLine()) != null) {
                if (line.equals("stop")) control.stopCell();
                else if (!line.isEmpty()) requests.add(line);
            }
        } catch (Exception e) {
            // the Jupyter half is gone: stop below
        }
        requests.add(new Stop());
    }

    static String decode(String b64) {
        return new String(Base64.getDecoder().decode(b64), StandardCharsets.UTF_8);
    }

    static synchronized void send(String json) {
        protocol.print(json);
        protocol.print('\n');
        protocol.flush();
    }

    static void sendError(String name, String value, List<String> traceback) {
        StringBuilder tb = new StringBuilder("[");
        for (int i = 0; i < traceback.size(); i++) {
            if (i > 0) tb.append(',');
            tb.append(json(traceback.get(i)));
        }
        tb.append(']');
        send("{\"t\":\"error\",\"ename\":" + json(name) + ",\"evalue\":" + json(value) + ",\"traceback\":" + tb + "}");
    }

    static String json(String text) {
        StringBuilder out = new StringBuilder(text.length() + 2).append('"');
        for (int i = 0; i < text.length(); i++) {
            char c = text.charAt(i);
            switch (c) {
                case '"' -> out.append("\\\"");
                case '\\' -> out.append("\\\\");
                case '\n' -> out.append("\\n");
                case '\r' -> out.append("\\r");
                case '\t' -> out.append("\\t");
                default -> {
                    if (c < 0x20) out.append(String.format("\\u%04x", (int) c));
                    else out.append(c);
                }
            }
        }
        return out.append('"').toString();
    }

    /** Splits a cell into snippets and evaluates them in order; the last one's value is the cell's result. */
    static final class Cells {
        private final JShell shell;
        private final CellControl control;

        Cells(JShell shell, CellControl control) {
            this.shell = shell;
            this.control = control;
        }

        void eval(String code, boolean report) {
            control.startCell();
            SourceCodeAnalysis analysis = shell.sourceCodeAnalysis();
            SourceCodeAnalysis.CompletionInfo info = analysis.analyzeCompletion(code);
            boolean hasResult = false;
            Object result = null;
            while (info.completeness().isComplete()) {
                if (control.stopRequested()) {
                    if (report) sendInterrupted();
                    return;
                }
                control.clearValue();
                List<SnippetEvent> events = shell.eval(info.source());
                if (control.stopRequested()) {
                    if (report) sendInterrupted();
                    return;
                }
                for (SnippetEvent event : events) {
                    if (event.causeSnippet() != null) continue;
                    JShellException exception = event.exception();
                    if (exception != null) {
                        if (report) sendException(exception);
                        return;
                    }
                    if (!event.status().isDefined()) {
                        if (report) sendCompilationError(event.snippet());
                        return;
                    }
                }
                SnippetEvent main = events.isEmpty() ? null : events.get(events.size() - 1);
                hasResult = main != null && control.hasValue() && shownKinds(main.snippet().subKind());
                result = hasResult ? control.value() : null;
                info = analysis.analyzeCompletion(info.remaining());
            }
            if (info.completeness() != SourceCodeAnalysis.Completeness.EMPTY) {
                String rest = info.remaining().trim();
                if (report) sendError("IncompleteSourceException", rest, List.of("Incomplete input:", rest));
                return;
            }
            if (report && hasResult && result != null) send("{\"t\":\"result\",\"text\":" + json(render(result)) + "}");
        }

        /** As IJava: a bare expression, a variable's name, or an assignment shows its value; declarations do not. */
        private static boolean shownKinds(Snippet.SubKind kind) {
            return kind == Snippet.SubKind.VAR_VALUE_SUBKIND
                    || kind == Snippet.SubKind.OTHER_EXPRESSION_SUBKIND
                    || kind == Snippet.SubKind.TEMP_VAR_EXPRESSION_SUBKIND;
        }

        private static String render(Object value) {
            if (value.getClass().isArray()) {
                String deep = Arrays.deepToString(new Object[] {value});
                return deep.substring(1, deep.length() - 1);
            }
            return String.valueOf(value);
        }

        private void sendInterrupted() {
            sendError("EvaluationInterruptedException", "Evaluation interrupted.", List.of("Evaluation interrupted."));
        }

        private void sendException(JShellException exception) {
            List<String> traceback = new ArrayList<>();
            if (exception instanceof EvalException eval) {
                String message = eval.getMessage();
                traceback.add(eval.getExceptionClassName() + (message == null ? "" : ": " + message));
                for (StackTraceElement frame : eval.getStackTrace()) traceback.add("\tat " + frame);
                sendError("EvalException", String.valueOf(message), traceback);
            } else if (exception instanceof UnresolvedReferenceException unresolved) {
                Snippet snippet = unresolved.getSnippet();
                traceback.add(snippet.source().trim());
                traceback.add("Unresolved dependencies:");
                shell.unresolvedDependencies(unresolved.getSnippet()).forEach(d -> traceback.add("   - " + d));
                sendError("UnresolvedReferenceException", String.valueOf(exception.getMessage()), traceback);
            } else {
                sendError(exception.getClass().getSimpleName(), String.valueOf(exception.getMessage()), traceback);
            }
        }

        private void sendCompilationError(Snippet snippet) {
            List<String> traceback = new ArrayList<>();
            List<String> messages = new ArrayList<>();
            shell.diagnostics(snippet).forEach((Diag diag) -> {
                String message = diag.getMessage(Locale.ROOT);
                messages.add(message);
                traceback.add(snippet.source().trim());
                traceback.add(message);
            });
            String value = messages.isEmpty() ? "the snippet could not be compiled" : messages.get(0);
            sendError("CompilationException", value, traceback);
        }
    }

    /**
     * Runs each snippet on a thread of its own so `stop` can end it (Thread.stop: a loop that never checks for
     * interrupts still ends), and keeps the snippet's value as an object.
     */
    static final class CellControl extends DirectExecutionControl {
        private static final Object NONE = new Object();
        private volatile Thread running;
        private volatile boolean stop;
        private volatile Object value = NONE;

        void startCell() {
            stop = false;
        }

        boolean stopRequested() {
            return stop;
        }

        void clearValue() {
            value = NONE;
        }

        boolean hasValue() {
            return value != NONE;
        }

        Object value() {
            return value;
        }

        @SuppressWarnings({"removal", "deprecation"})
        void stopCell() {
            stop = true;
            Thread thread = running;
            if (thread != null) thread.stop();
        }

        @Override
        protected String invoke(Method doitMethod) throws Exception {
            Object[] result = new Object[1];
            Throwable[] failure = new Throwable[1];
            Thread thread = new Thread(() -> {
                try {
                    result[0] = doitMethod.invoke(null);
                } catch (Throwable t) {
                    failure[0] = t;
                }
            }, "warren-cell");
            if (stop) throw new ExecutionControl.StoppedException();
            running = thread;
            thread.start();
            try {
                thread.join();
            } finally {
                running = null;
            }
            if (stop) throw new ExecutionControl.StoppedException();
            Throwable thrown = failure[0];
            if (thrown instanceof InvocationTargetException target) throw target;
            if (thrown instanceof Exception exception) throw exception;
            if (thrown != null) throw new InvocationTargetException(thrown);
            value = result[0];
            return valueString(result[0]);
        }

        /** A snippet that is a variable's name is read, not invoked: keep that value as an object too. */
        @Override
        public String varValue(String className, String varName) throws ExecutionControl.RunException,
                ExecutionControl.EngineTerminationException, ExecutionControl.InternalException {
            try {
                Field field = findClass(className).getDeclaredField(varName);
                field.setAccessible(true);
                value = field.get(null);
            } catch (ReflectiveOperationException | RuntimeException e) {
                throw new ExecutionControl.InternalException(e.toString());
            }
            return valueString(value);
        }

        @Override
        public void stop() {
            stopCell();
        }
    }

    static final class CellControlProvider implements ExecutionControlProvider {
        private final CellControl control;

        CellControlProvider(CellControl control) {
            this.control = control;
        }

        @Override
        public String name() {
            return "warren";
        }

        @Override
        public Map<String, String> defaultParameters() {
            return Map.of();
        }

        @Override
        public ExecutionControl generate(ExecutionEnv env, Map<String, String> parameters) {
            return control;
        }
    }

    /**
     * Env vars of a running JVM: E2B's Java kernel sets them as system properties (System.getProperty), and
     * Warren also puts them in the process environment (System.getenv, subprocesses), as the other languages do.
     * The JVM's environment map is read-only by design; the kernel starts with --add-opens java.base/java.util.
     */
    static final class Environment {
        @SuppressWarnings("unchecked")
        private static Map<String, String> writable() {
            try {
                Map<String, String> view = System.getenv();
                Field inner = view.getClass().getDeclaredField("m");
                inner.setAccessible(true);
                return (Map<String, String>) inner.get(view);
            } catch (ReflectiveOperationException | RuntimeException e) {
                return null;
            }
        }

        static void set(String name, String value) {
            System.setProperty(name, value);
            Map<String, String> env = writable();
            if (env != null) env.put(name, value);
        }

        static void unset(String name) {
            System.clearProperty(name);
            Map<String, String> env = writable();
            if (env != null) env.remove(name);
        }
    }

    /** A cell's System.out / System.err: each flush becomes a stream event. */
    static final class EventStream extends OutputStream {
        private final String name;
        private final java.io.ByteArrayOutputStream buffer = new java.io.ByteArrayOutputStream();

        EventStream(String name) {
            this.name = name;
        }

        @Override
        public synchronized void write(int b) {
            buffer.write(b);
        }

        @Override
        public synchronized void write(byte[] bytes, int offset, int length) {
            buffer.write(bytes, offset, length);
            if (buffer.size() > 65536) flush();
        }

        @Override
        public synchronized void flush() {
            if (buffer.size() == 0) return;
            String text = buffer.toString(StandardCharsets.UTF_8);
            buffer.reset();
            send("{\"t\":\"" + name + "\",\"text\":" + json(text) + "}");
        }
    }
}
