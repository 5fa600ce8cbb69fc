//! Running the model's code: the policy, the runtime, the time limit, and shaping output.

use super::*;
use crate::agent::sub::LinkScope;
use crate::{
    Approval, ApprovalRequest, DisplayData, DisplayItem, ImagePart, LiveOutput, RuntimeExt,
    SecretRedactor, StreamRedaction,
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
}

impl ChannelSink {
    fn new(sender: mpsc::UnboundedSender<LiveOutput>) -> Self {
        Self {
            sender,
            sent: 0.into(),
            held_back: 0.into(),
            items: 0.into(),
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
        if let Some(refused) = self.screen(code) {
            return Ok(refused);
        }
        if let Some(refused) = self.ask_approval(code).await {
            return Ok(refused);
        }
        let runtime = self.agent.runtime.clone();
        let (sender, mut live) = mpsc::unbounded_channel();
        let sink = ChannelSink::new(sender);
        let now = tokio::time::Instant::now();
        let deadline = self.cell_deadline(now);
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
                result = &mut execution => break Some(result),
                () = sleep_until(deadline) => break None,
                Some(piece) = live.recv() => {
                    self.live_piece(piece, &mut shown, &redactor, &mut item_lines, &mut images).await;
                }
                Some(event) = nested.recv() => self.emit.emit(event).await,
            }
        };
        let Some(result) = finished else {
            let limit = deadline.map_or(0.0, |d| (d - now).as_secs_f64());
            return self.timed_out(execution, limit).await;
        };
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
        tracing::info!(
            limit,
            state_lost,
            pending,
            "execution stopped at its time limit"
        );
        let mut result = prompt::execution_timeout(limit);
        if state_lost {
            result.push_str("\n\n");
            result.push_str(prompt::STATE_LOST_NOTICE);
        }
        if pending {
            result.push_str("\n\n");
            result.push_str(prompt::INTERRUPT_PENDING_NOTICE);
        }
        Ok((
            Event::ExecutionTimeout {
                timeout: limit,
                state_lost,
            },
            Message::execution_result(result),
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

/// The image an item can send to a model that reads images: its PNG or JPEG form, when its
/// header gives its size.
fn image_part(item: &DisplayItem) -> Option<ImagePart> {
    ["image/png", "image/jpeg"].into_iter().find_map(|mime| {
        let data = item.get(mime)?;
        let (width, height) = crate::image_size(mime, data.as_bytes())?;
        Some(ImagePart::new(mime, data.as_bytes(), width, height))
    })
}
