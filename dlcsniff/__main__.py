from dlcsniff.cli import app

app(prog_name="dlcsniff")
