//! Running the model's code: the policy, the runtime, the time limit, and shaping output.

use super::*;
use crate::agent::sub::LinkScope;
use crate::{
    Approval, ApprovalRequest, DisplayData, DisplayItem, HostCallMeter, ImagePart, LiveOutput,
    RuntimeExt, SecretRedactor, StreamRedaction,
};

/// Forwards live output into the run as `ExecutionOutput` events, up to
/// [`DEFAULT_MAX_HELD_OUTPUT`](crate::DEFAULT_MAX_HELD_OUTPUT) per cell: past it, pieces are
/// counted instead of queued, so that a cell printing faster than the consumer reads cannot
/// grow the host (the runtime's result keeps the output's end).
pub(super) struct ChannelSink {
    sender: mpsc::UnboundedSender<LiveOutput>,
    sent: std::sync::atomic::AtomicUsize,
    held_back: std::sync::atomic::AtomicU64,
    /// Display items taken (at most `MAX_DISPLAY_ITEMS` a cell, whatever the runtime sends).
    items: std::sync::atomic::AtomicUsize,
    /// The cell's host calls, for the ledger and the host-call budget.
    meter: std::sync::Arc<HostCallMeter>,
}

impl ChannelSink {
    fn new(sender: mpsc::UnboundedSender<LiveOutput>, meter: HostCallMeter) -> Self {
        Self {
            sender,
            sent: 0.into(),
            held_back: 0.into(),
            items: 0.into(),
            meter: std::sync::Arc::new(meter),
        }
    }

    /// What the consumer is told in place of the live output held back, if any was.
    fn held_back_note(&self) -> Option<String> {
        let bytes = self.held_back.load(std::sync::atomic::Ordering::Relaxed);
        (bytes > 0).then(|| {
            format!(
                "\n[… {} more output, not shown live (live output stops at {} a cell); the result keeps its end]\n",
                crate::format_size(bytes),
                crate::format_size(crate::DEFAULT_MAX_HELD_OUTPUT as u64)
            )
        })
    }
}

impl OutputSink for ChannelSink {
    fn write(&self, chunk: &str) {
        use std::sync::atomic::Ordering::Relaxed;
        let sent = self.sent.fetch_add(chunk.len(), Relaxed);
        if sent.saturating_add(chunk.len()) > crate::DEFAULT_MAX_HELD_OUTPUT {
            self.sent.fetch_sub(chunk.len(), Relaxed);
            self.held_back.fetch_add(chunk.len() as u64, Relaxed);
            return;
        }
        // The receiver is gone only once the execution is over; late output has no reader.
        let _ = self.sender.send(LiveOutput::Text(chunk.to_owned()));
    }

    fn display(&self, item: DisplayItem) {
        let taken = self
            .items
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        if taken < crate::MAX_DISPLAY_ITEMS {
            let _ = self.sender.send(LiveOutput::Display(item));
        }
    }

    fn host_calls(&self) -> Option<std::sync::Arc<HostCallMeter>> {
        Some(self.meter.clone())
    }
}

/// How often a running cell's processor time is read against the session's budget.
const CPU_POLL: Duration = Duration::from_millis(50);

/// Why the wait for a cell ended.
enum Finished<T> {
    Ran(T),
    /// Its time limit (or the run's) came.
    Deadline,
    /// The session's processor-time budget ran out while it ran.
    CpuSpent,
}

/// Processor seconds used between two readings of a runtime (`None`: unmeasured). A reading
/// lower than the first means the runtime's process was replaced: the new one's count is
/// what it used.
fn cpu_between(
    start: Option<crate::ResourceUsage>,
    end: Option<crate::ResourceUsage>,
) -> Option<f64> {
    let end = end?;
    Some(match start {
        Some(start) if end.cpu_seconds >= start.cpu_seconds => end.cpu_seconds - start.cpu_seconds,
        _ => end.cpu_seconds,
    })
}

impl Run<'_> {
    /// The policy's refusal of `code`, as the event and the result the model reads, if it
    /// refuses.
    fn screen(&self, code: &str) -> Option<(Event, Message)> {
        let violations = self.agent.policy.as_ref()?.check(code);
        if violations.is_empty() {
            return None;
        }
        let message = crate::policy::refusal_message(&violations);
        let result = prompt::security_error(&message);
        Some((
            Event::SecurityError {
                message,
                violations,
            },
            Message::execution_result(result),
        ))
    }

    /// The approver's refusal of `code`, if cells are asked about and it refuses (the request
    /// is an event first).
    async fn ask_approval(&mut self, code: &str) -> Option<(Event, Message)> {
        let approver = self
            .agent
            .approver
            .clone()
            .filter(|_| self.agent.approve_cells)?;
        let request = ApprovalRequest::Cell {
            code: code.to_owned(),
        };
        self.emit
            .emit(Event::ApprovalRequested {
                request: request.clone(),
            })
            .await;
        match approver.inner().approve(&request).await {
            Approval::Approved => None,
            Approval::Refused(reason) => {
                tracing::info!(?reason, "the approver refused the cell");
                let message = prompt::cell_refused(reason.as_deref());
                Some((
                    Event::ExecutionRefused { reason },
                    Message::execution_result(message),
                ))
            }
        }
    }

    /// When a cell started `now` must end: its own limit, or the run's when that comes first
    /// (a cell cannot outlast the run's time budget, which is otherwise checked between
    /// steps).
    fn cell_deadline(&self, now: tokio::time::Instant) -> Option<tokio::time::Instant> {
        let run_deadline = self
            .agent
            .config
            .max_run_time
            .map(|limit| now + limit.saturating_sub(self.started.elapsed()));
        match (
            self.agent.config.max_exec_timeout.map(|t| now + t),
            run_deadline,
        ) {
            (Some(cell), Some(run)) => Some(cell.min(run)),
            (cell, run) => cell.or(run),
        }
    }

    /// Runs the code (unless the policy refuses it): the event and the execution result.
    pub(super) async fn execute(&mut self, code: &str) -> Result<(Event, Message), Failure> {
        if let Some(spent) = self.session_budget_error() {
            // A budget a cell would overrun is spent: nothing runs (nor is anyone asked to
            // approve it), and the run stops before its next step.
            let message = prompt::budget_spent(&spent.message);
            return Ok((
                Event::ExecutionRefused {
                    reason: Some(spent.message),
                },
                Message::execution_result(message),
            ));
        }
        if let Some(refused) = self.screen(code) {
            return Ok(refused);
        }
        if let Some(refused) = self.ask_approval(code).await {
            return Ok(refused);
        }
        let runtime = self.agent.runtime.clone();
        let (sender, mut live) = mpsc::unbounded_channel();
        let meter = match self.agent.config.max_host_calls {
            Some(budget) => HostCallMeter::with_allowance(
                budget.saturating_sub(self.agent.ledger.total_calls()),
                budget,
            ),
            None => HostCallMeter::new(),
        };
        let sink = ChannelSink::new(sender, meter);
        let now = tokio::time::Instant::now();
        let deadline = self.cell_deadline(now);
        // The processor time the cell may use before it is stopped, when there is a budget.
        let cpu_left = self
            .agent
            .config
            .max_cpu_time
            .map(|cap| cap.as_secs_f64() - self.agent.ledger.cpu_seconds.unwrap_or(0.0));
        let mut cpu_poll = tokio::time::interval(CPU_POLL);
        cpu_poll.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let resources_before = runtime.resource_usage();
        // Sub-agents the code runs send their events here; they are cancelled when this
        // execution ends, however it ends.
        let (nested_sender, mut nested) = mpsc::unbounded_channel();
        let _links = (!self.agent.sub_agents.is_empty())
            .then(|| LinkScope::new(&self.agent.sub_agents, nested_sender.clone()));
        // Guarded host calls announce their approval requests there too.
        let _announcing = self
            .agent
            .approver
            .as_ref()
            .map(|approver| approver.announce_to(nested_sender));
        // Secrets never leave as they are: live output is redacted as it streams (a piece
        // that could be the start of one waits), the whole output once more at the end.
        let redactor = SecretRedactor::new(runtime.secrets());
        let mut shown = redactor.stream();
        // A line per item with rich forms, for the model (after the output), and the images
        // that may go with it.
        let mut item_lines = Vec::new();
        let mut images = Vec::new();
        self.executing = true;
        let execution = runtime.execute(code, &sink);
        tokio::pin!(execution);
        let finished = loop {
            tokio::select! {
                // The deadline before the output: a cell printing without pause always has
                // output ready, and would otherwise never be stopped.
                biased;
                result = &mut execution => break Finished::Ran(result),
                () = sleep_until(deadline) => break Finished::Deadline,
                _ = cpu_poll.tick(), if cpu_left.is_some() => {
                    let used = cpu_between(resources_before, runtime.resource_usage());
                    if let (Some(left), Some(used)) = (cpu_left, used) && used >= left {
                        break Finished::CpuSpent;
                    }
                }
                Some(piece) = live.recv() => {
                    self.live_piece(piece, &mut shown, &redactor, &mut item_lines, &mut images).await;
                }
                Some(event) = nested.recv() => self.emit.emit(event).await,
            }
        };
        let result = match finished {
            Finished::Ran(result) => result,
            Finished::Deadline => {
                let limit = deadline.map_or(0.0, |d| (d - now).as_secs_f64());
                let stopped = self.timed_out(execution, limit).await;
                self.account_cell(now, resources_before, &sink);
                return stopped;
            }
            Finished::CpuSpent => {
                let stopped = self.cpu_spent(execution).await;
                self.account_cell(now, resources_before, &sink);
                return stopped;
            }
        };
        self.account_cell(now, resources_before, &sink);
        self.executing = false;
        while let Ok(piece) = live.try_recv() {
            self.live_piece(piece, &mut shown, &redactor, &mut item_lines, &mut images)
                .await;
        }
        let mut tail = shown.finish();
        if let Some(note) = sink.held_back_note() {
            tail.push_str(&note);
        }
        if !tail.is_empty() {
            self.emit.emit(Event::ExecutionOutput { chunk: tail }).await;
        }
        while let Ok(event) = nested.try_recv() {
            self.emit.emit(event).await;
        }
        let mut execution = result.map_err(Failure::Runtime)?;
        for c in &execution.connections.list {
            self.agent
                .ledger
                .add_connection(c.allowed, c.sent, c.received);
        }
        // Connections past a cell's account: counted, their bytes unknown.
        let omitted = &mut self.agent.ledger.egress.connections;
        *omitted = omitted.saturating_add(execution.connections.omitted);
        if !execution.connections.is_empty() {
            let mut connections = std::mem::take(&mut execution.connections);
            // A refusal's reason names the host it refused, which is the cell's own text:
            // redacted as the output is.
            for c in &mut connections.list {
                c.reason = c.reason.as_deref().map(|r| redactor.redact(r));
                c.host = redactor.redact(&c.host);
            }
            self.emit.emit(Event::Egress(connections)).await;
        }
        let success = execution.success();
        let state_lost = execution.state_lost;
        let spooled = execution.spooled;
        let output = match (execution.output.is_empty(), execution.error) {
            (false, _) => execution.output,
            (true, Some(error)) => format!("{}: {}", error.python_type, error.message),
            (true, None) => prompt::EMPTY_OUTPUT.to_owned(),
        };
        let output = redactor.redact(&output);
        let (body, persisted) = self.shape_output(&output, spooled.as_deref()).await?;
        let mut result = prompt::execution_output(&body);
        let (images, left_out) = self.within_image_budget(images);
        for line in item_lines.iter().chain(&left_out) {
            result.push('\n');
            result.push_str(line);
        }
        if state_lost {
            result.push_str("\n\n");
            result.push_str(prompt::STATE_LOST_NOTICE);
        }
        let event = Event::ExecutionResult {
            output,
            success,
            persisted: persisted.is_some(),
            persisted_variable: persisted.as_ref().map(|p| p.variable.clone()),
            state_lost,
        };
        let message = match persisted {
            Some(persisted) => Message::persisted_result(result, persisted),
            None => Message::execution_result(result),
        };
        Ok((event, message.with_images(images)))
    }

    /// A piece of the running cell's output: text goes out as it streams (redacted), an item
    /// is shown (see [`show_item`](Self::show_item)) and its line kept for the model.
    async fn live_piece(
        &mut self,
        piece: LiveOutput,
        shown: &mut StreamRedaction<'_>,
        redactor: &SecretRedactor,
        item_lines: &mut Vec<String>,
        images: &mut Vec<ImagePart>,
    ) {
        match piece {
            LiveOutput::Text(chunk) => {
                let chunk = shown.push(&chunk);
                if !chunk.is_empty() {
                    self.emit.emit(Event::ExecutionOutput { chunk }).await;
                }
            }
            LiveOutput::Display(item) => {
                if self.agent.config.image_budget.is_some() {
                    images.extend(image_part(&item));
                }
                if let Some(line) = self.show_item(item, redactor).await {
                    item_lines.push(line);
                }
            }
        }
    }

    /// Shows an item: its text forms redacted, its rich forms written under the display
    /// directory (when there is one), a `display` event; the line the model reads about it,
    /// when it has rich forms.
    async fn show_item(&mut self, item: DisplayItem, redactor: &SecretRedactor) -> Option<String> {
        let mut item = item;
        for (_, data) in &mut item.forms {
            if let DisplayData::Text(text) = data {
                *text = redactor.redact(text);
            }
        }
        self.agent.displays += 1;
        let number = self.agent.displays;
        let (files, failures) = match self.agent.config.display_dir.clone() {
            Some(dir) if item.rich_forms().next().is_some() => {
                let forms = item.clone();
                tokio::task::spawn_blocking(move || {
                    crate::display::write_forms(&dir, number, &forms)
                })
                .await
                .unwrap_or_default()
            }
            _ => Default::default(),
        };
        for failure in &failures {
            tracing::warn!(%failure, "a display item's form could not be written");
        }
        let line = prompt::display_line(&item, &files, &failures);
        self.emit
            .emit(Event::Display {
                mime_types: item.mime_types().iter().map(|m| (*m).to_owned()).collect(),
                text: item.text().to_owned(),
                files: files
                    .iter()
                    .map(|(mime, path)| (mime.clone(), path.display().to_string()))
                    .collect(),
                item: Some(Box::new(item)),
            })
            .await;
        line
    }

    /// The images that fit the budget, in order, and a line for those that do not.
    fn within_image_budget(&self, images: Vec<ImagePart>) -> (Vec<ImagePart>, Vec<String>) {
        let Some(budget) = self.agent.config.image_budget else {
            return (Vec::new(), Vec::new());
        };
        let mut spent = 0u64;
        let mut sent = Vec::new();
        let mut left_out = 0;
        for image in images {
            let tokens = self
                .agent
                .estimator
                .estimate_image(image.width, image.height);
            if spent + tokens <= budget {
                spent += tokens;
                sent.push(image);
            } else {
                left_out += 1;
            }
        }
        let note = (left_out > 0).then(|| prompt::images_left_out(left_out, budget));
        (sent, note.into_iter().collect())
    }

    /// A cell ended (however it ended): what it cost goes into the ledger (its wall time since
    /// `started`, the processor time since `before`, the runtime's peak memory, the host calls
    /// the meter counted).
    fn account_cell(
        &mut self,
        started: tokio::time::Instant,
        before: Option<crate::ResourceUsage>,
        sink: &ChannelSink,
    ) {
        let after = self.agent.runtime.resource_usage();
        let ledger = &mut self.agent.ledger;
        ledger.cells = ledger.cells.saturating_add(1);
        ledger.cell_seconds += started.elapsed().as_secs_f64();
        ledger.add_resources(
            cpu_between(before, after),
            after.and_then(|a| a.peak_memory),
        );
        for (mcp, name, calls) in sink.meter.take() {
            ledger.count_call(&name, mcp, calls);
        }
        ledger.refused_host_calls = ledger
            .refused_host_calls
            .saturating_add(sink.meter.refused());
    }

    /// Interrupts the execution in flight and gives it a moment to unwind: whether the
    /// runtime's state was lost, and whether the execution is still pending after the grace.
    async fn stop_execution<F>(
        &mut self,
        execution: std::pin::Pin<&mut F>,
    ) -> Result<(bool, bool), Failure>
    where
        F: std::future::Future<Output = Result<crate::Execution, RuntimeError>>,
    {
        let interruption = self.interrupt_execution();
        let settled = tokio::time::timeout(INTERRUPT_GRACE, execution).await;
        let mut state_lost = interruption == Some(Interruption::StateLost);
        let pending = match settled {
            Ok(Ok(execution)) => {
                state_lost |= execution.state_lost;
                false
            }
            Ok(Err(error)) => return Err(Failure::Runtime(error)),
            Err(_) => true,
        };
        Ok((state_lost, pending))
    }

    /// The execution ran for `limit` seconds, its `max_exec_timeout` or what was left of the
    /// run's `max_run_time`: interrupt it and give it a moment to unwind.
    pub(super) async fn timed_out<F>(
        &mut self,
        execution: std::pin::Pin<&mut F>,
        limit: f64,
    ) -> Result<(Event, Message), Failure>
    where
        F: std::future::Future<Output = Result<crate::Execution, RuntimeError>>,
    {
        let (state_lost, pending) = self.stop_execution(execution).await?;
        tracing::info!(
            limit,
            state_lost,
            pending,
            "execution stopped at its time limit"
        );
        let result = prompt::execution_timeout(limit);
        Ok((
            Event::ExecutionTimeout {
                timeout: limit,
                state_lost,
            },
            Message::execution_result(stopped_notes(result, state_lost, pending)),
        ))
    }

    /// The session's processor-time budget ran out while the execution ran: interrupt it, and
    /// tell the model (the run then stops, the budget being spent).
    async fn cpu_spent<F>(
        &mut self,
        execution: std::pin::Pin<&mut F>,
    ) -> Result<(Event, Message), Failure>
    where
        F: std::future::Future<Output = Result<crate::Execution, RuntimeError>>,
    {
        let (state_lost, pending) = self.stop_execution(execution).await?;
        let budget = self
            .agent
            .config
            .max_cpu_time
            .map_or(0.0, |b| b.as_secs_f64());
        tracing::info!(
            budget,
            state_lost,
            pending,
            "execution stopped: the processor-time budget is spent"
        );
        let output = prompt::cpu_budget_spent(budget);
        let message = stopped_notes(output.clone(), state_lost, pending);
        Ok((
            Event::ExecutionResult {
                output,
                success: false,
                persisted: false,
                persisted_variable: None,
                state_lost,
            },
            Message::execution_result(message),
        ))
    }

    /// Inlines small output; stores large output in the runtime and returns a marker. Output
    /// the runtime kept whole in a file (`spooled`, when `output` holds only its ends) is bound
    /// from the file, so `_output_N` is the whole text.
    pub(super) async fn shape_output(
        &mut self,
        output: &str,
        spooled: Option<&crate::SpooledOutput>,
    ) -> Result<(String, Option<PersistedOutput>), Failure> {
        let config = &self.agent.config;
        if spooled.is_none() && output.chars().count() <= config.max_exec_output {
            return Ok((output.to_owned(), None));
        }
        let prefix = config.persisted_output_prefix.clone();
        let persisted = crate::persist_output(
            self.agent.runtime.as_ref(),
            &prefix,
            output,
            spooled,
            self.agent.persisted_floor,
            config.exec_output_preview_chars,
        )
        .await
        .map_err(Failure::Runtime)?;
        self.agent.persisted_floor = self
            .agent
            .persisted_floor
            .max(persisted.index.saturating_add(1));
        tracing::info!(
            variable = %persisted.variable,
            chars = persisted.chars,
            "execution output persisted in the runtime"
        );
        Ok((
            persisted.marker,
            Some(PersistedOutput::new(
                &prefix,
                persisted.index,
                persisted.chars,
            )),
        ))
    }
}

/// What the model reads about a stopped execution: `result`, and whether the runtime's state
/// was lost and the execution is still unwinding.
fn stopped_notes(mut result: String, state_lost: bool, pending: bool) -> String {
    if state_lost {
        result.push_str("\n\n");
        result.push_str(prompt::STATE_LOST_NOTICE);
    }
    if pending {
        result.push_str("\n\n");
        result.push_str(prompt::INTERRUPT_PENDING_NOTICE);
    }
    result
}

/// The image an item can send to a model that reads images: its PNG or JPEG form, when its
/// header gives its size.
fn image_part(item: &DisplayItem) -> Option<ImagePart> {
    ["image/png", "image/jpeg"].into_iter().find_map(|mime| {
        let data = item.get(mime)?;
        let (width, height) = crate::image_size(mime, data.as_bytes())?;
        Some(ImagePart::new(mime, data.as_bytes(), width, height))
    })
}
