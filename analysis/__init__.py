"""ctxpar analysis: trace loader (ctxpar_trace), tables, figures, exports."""
