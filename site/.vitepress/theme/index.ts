// The default VitePress theme plus three things the course needs: mermaid blocks rendered to SVG, a search that
// tokenizes Chinese the way the index was built, and the chapter index on the home page.
import DefaultTheme from "vitepress/theme";
import type { Theme } from "vitepress";
import { useData, useRoute } from "vitepress";
import { nextTick, onMounted, watch } from "vue";
import { tokenize } from "../../lib/tokenize.js";
import ChapterIndex from "./ChapterIndex.vue";
import "./custom.css";

let counter = 0;

/** Render every mermaid placeholder on the page that is not rendered yet; a diagram that fails logs a console error. */
async function renderDiagrams(dark: boolean): Promise<void> {
  await nextTick();
  const nodes = [...document.querySelectorAll<HTMLElement>(".mermaid[data-src]:not([data-rendered])")];
  if (nodes.length === 0) return;
  const { default: mermaid } = await import("mermaid");
  mermaid.initialize({
    startOnLoad: false,
    securityLevel: "strict",
    theme: dark ? "dark" : "default",
    fontFamily: '"Noto Sans CJK SC", "WenQuanYi Micro Hei", "PingFang SC", "Microsoft YaHei", sans-serif',
  });
  for (const node of nodes) {
    node.dataset.rendered = "pending";
    try {
      const { svg } = await mermaid.render(`pi-mermaid-${++counter}`, decodeURIComponent(node.dataset.src!));
      node.innerHTML = svg;
      node.dataset.rendered = "svg";
    } catch (error) {
      node.dataset.rendered = "error";
      node.textContent = decodeURIComponent(node.dataset.src!);
      console.error("mermaid 图没有渲染出来：", error);
    }
  }
}

export default {
  extends: DefaultTheme,
  enhanceApp({ app, siteData }) {
    app.component("ChapterIndex", ChapterIndex);
    const search = siteData.value.themeConfig.search;
    if (search?.provider === "local") {
      search.options ??= {};
      search.options.miniSearch ??= {};
      search.options.miniSearch.options = { ...search.options.miniSearch.options, tokenize };
    }
  },
  setup() {
    const route = useRoute();
    const { isDark } = useData();
    onMounted(() => void renderDiagrams(isDark.value));
    watch(() => route.path, () => void renderDiagrams(isDark.value), { flush: "post" });
    watch(isDark, (dark) => {
      for (const node of document.querySelectorAll<HTMLElement>(".mermaid[data-rendered]")) delete node.dataset.rendered;
      void renderDiagrams(dark);
    });
  },
} satisfies Theme;
