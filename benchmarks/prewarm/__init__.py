"""Pre-warm backtest: the Alibaba GPU trace's demand replayed against no pre-warm, a scaling window, and the
forecast, through the real window, forecast and decision code."""
