"""Stand-in for Zhipu's `zai` SDK (a hosted web search) in third-party ART programs: `ZhipuAiClient(...)
.web_search.web_search(...)` answers every query with two fixed results in the SDK's shape, and keeps
the queries so a test can see the program's tool ran."""

QUERIES: list[str] = []


class _WebSearch:
    def web_search(self, *, search_query: str, **kwargs):
        QUERIES.append(search_query)
        return {"search_result": [
            {"url": f"https://example.com/{i}", "title": f"About {search_query}", "content": f"Fact {i} on {search_query}."}
            for i in range(2)]}


class ZhipuAiClient:
    def __init__(self, api_key: str | None = None, **kwargs) -> None:
        self.web_search = _WebSearch()
