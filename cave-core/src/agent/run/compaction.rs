//! Compaction between steps, and after a prompt the provider found too long.

use super::*;

impl Run<'_> {
    pub(super) async fn maybe_compact(&mut self) {
        let before = self.agent.history.len();
        let prepared = self.agent.compactor.prepare(
            &self.agent.history,
            self.agent.anchor,
            self.agent.estimator.as_ref(),
        );
        if let Some(history) = prepared.history {
            self.agent.history = history;
        }
        if prepared.needs_summary {
            self.emit.emit(Event::Status(Status::Compacting)).await;
            // A clone, so that a run cancelled mid-summary keeps its history.
            let summarized = tracing::Instrument::instrument(
                self.agent
                    .compactor
                    .summarize(self.agent.history.clone(), self.agent.estimator.as_ref()),
                spans::compaction(),
            )
            .await;
            self.settle_summary(summarized, before).await;
        }
    }

    /// Takes a summary's history, counts its tokens, and says how it went.
    pub(super) async fn settle_summary(&mut self, summarized: crate::Summarized, before: usize) {
        self.usage += summarized.usage;
        self.agent.history = summarized.history;
        let status = match summarized.error {
            Some(error) => {
                tracing::warn!(%error, "compaction failed; history kept");
                Status::CompactionFailed {
                    message: error.to_string(),
                }
            }
            None => Status::Compacted {
                before,
                after: self.agent.history.len(),
            },
        };
        self.emit.emit(Event::Status(status)).await;
    }
}
