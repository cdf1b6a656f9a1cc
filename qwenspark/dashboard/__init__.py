"""The web dashboard over the result views (`qwenspark dashboard`): app.py serves, queries.py reads."""
