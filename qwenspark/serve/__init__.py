"""The online path (`qwenspark serve`): one review analysed on request, with the batch job's prompt, grammar, parsing
and result rows; engine.py runs the model, app.py the HTTP service, store.py the optional write-through."""
