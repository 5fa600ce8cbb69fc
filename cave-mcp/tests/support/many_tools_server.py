"""An MCP server of 500 tools on the official Python SDK, for the tests and benchmarks of tool
search: a catalogue of operations on the records of a small business (each tool one verb on one
kind of record, described in its own words), plus a few tools with something to show: a number
result (`fahrenheit`), an enum parameter (`convert_distance`), a structured result
(`forecast`, a model the SDK describes with an output schema) and a slow tool (`slow`).

`python many_tools_server.py --list` prints the tools as JSON lines (name, description) instead
of serving: the recall data is written from them."""

import json
import sys

import anyio
from typing import Literal

from mcp.server.mcpserver import MCPServer
from pydantic import BaseModel

server = MCPServer("cave-many")

# (verb, what it does, in a phrase that takes the record's name)
VERBS = [
    ("list", "Lists every {r} that matches the filters, newest first."),
    ("get", "Fetches one {r} by its identifier, with all of its fields."),
    ("create", "Creates a new {r} from the given fields and returns its identifier."),
    ("update", "Changes fields of an existing {r}; fields left out keep their values."),
    ("delete", "Removes a {r} for good; this cannot be undone."),
    ("archive", "Moves a {r} to the archive, where it is kept read-only."),
    ("restore", "Brings an archived {r} back into use."),
    ("search", "Finds each {r} whose text contains the query words."),
    ("count", "Counts how many {r} records match the filters."),
    ("export", "Writes every {r} to a CSV file and returns its path."),
    ("import", "Reads {r} records from a CSV file and adds them."),
    ("assign", "Gives a {r} to a member of staff to take care of."),
    ("tag", "Adds labels to a {r} so it can be grouped with others."),
    ("comment", "Adds a note to the history of a {r}."),
    ("approve", "Marks a {r} as approved by a manager."),
    ("reject", "Marks a {r} as rejected, with the reason given."),
    ("duplicate", "Makes a copy of a {r} under a new identifier."),
    ("merge", "Combines two {r} records into one, keeping the first identifier."),
    ("history", "Shows every change made to a {r}, who made it and when."),
    ("summarize", "Totals the amounts of each {r} over a period of time."),
]

# (record, what it is)
RECORDS = [
    ("invoice", "bill sent to a customer"),
    ("customer", "person or company that buys from us"),
    ("supplier", "company we buy stock from"),
    ("order", "purchase a customer placed"),
    ("shipment", "parcel on its way to a customer"),
    ("product", "item in the catalogue"),
    ("warehouse", "building where stock is kept"),
    ("employee", "member of staff"),
    ("timesheet", "hours an employee worked in a week"),
    ("expense", "cost an employee paid and claims back"),
    ("meeting", "appointment in the shared calendar"),
    ("ticket", "support request from a customer"),
    ("refund", "money paid back to a customer"),
    ("contract", "signed agreement with a customer or supplier"),
    ("payment", "money received from a customer"),
    ("budget", "planned spending of a department"),
    ("campaign", "marketing email sent to many customers"),
    ("coupon", "discount code customers enter at checkout"),
    ("review", "rating a customer gave a product"),
    ("vehicle", "van of the delivery fleet"),
    ("asset", "laptop, phone or other equipment lent to staff"),
    ("document", "file in the shared drive"),
    ("project", "piece of work with a deadline and a team"),
    ("task", "to-do item within a project"),
    ("lead", "possible customer who showed interest"),
]


def _operation(verb, record, text, noun):
    def operation(identifier: str = "", filters: dict | None = None, fields: dict | None = None) -> str:
        return f"{verb} {record} {identifier}".strip()

    operation.__name__ = f"{verb}_{record}"
    operation.__doc__ = text.format(r=f"{record} ({noun})")
    return operation


for record, noun in RECORDS:
    for verb, text in VERBS:
        if len(server._tool_manager._tools) >= 496:
            break
        server.add_tool(_operation(verb, record, text, noun), structured_output=False)


@server.tool()
def fahrenheit(celsius: float) -> float:
    """Converts a temperature from degrees Celsius to degrees Fahrenheit."""
    return celsius * 9 / 5 + 32


@server.tool()
def convert_distance(value: float, unit: Literal["km", "mi"] = "km") -> float:
    """Converts a distance into the other unit: kilometres to miles, or miles to kilometres."""
    return value / 1.609344 if unit == "km" else value * 1.609344


class Forecast(BaseModel):
    """Tomorrow's weather in a city."""

    city: str
    celsius: float
    summary: str | None = None


@server.tool()
def forecast(city: str) -> Forecast:
    """Tells the weather expected tomorrow in a city."""
    return Forecast(city=city, celsius=18.5, summary="clouds")


@server.tool()
async def slow(i: int) -> int:
    """Waits half a second, then returns its argument (for timing concurrent calls)."""
    await anyio.sleep(0.5)
    return i


if __name__ == "__main__":
    if "--list" in sys.argv:
        for tool in server._tool_manager.list_tools():
            print(json.dumps({"name": tool.name, "description": tool.description}))
    else:
        server.run()
